// `npx tsx bench/gpu-check.ts [--kernels NAME=VALUE,...] [--json FILE]`: the model against PyTorch
// on whatever GPU this runs, with that GPU's own 'auto' kernel choices: the first step of the
// device run (scripts/device-run.sh), so a real GPU's kernels are checked before they are timed.
// Not a benchmark and not a test runner (the device machine has no npm): plain checks against
// the committed fixtures, one line each, exit 1 when any fails.
// - golden (scripts/golden_qwen3.py, transformers' Qwen3ForCausalLM): every position's logits of
//   a one-chunk prefill (16 tokens: the GEMM on a GPU), and 16 greedy tokens (decode);
// - LoRA (scripts/golden_lora.py, PEFT): logits with the adapter, the loss and every LoRA gradient;
// - q4 (scripts/golden_q4.py): logits with --weights q4 against PyTorch's q4 reference;
// - the matmul at Qwen3-4B's MLP shapes (9728 x 2560 and 2560 x 9728), bf16 and q4 weights, for
//   1 and 4 rows (decode: the lane GEMV on a GPU) and 32 rows (prefill: the tiled GEMM), against
//   test/helpers/reference.ts (q4: its dequantized weights), so a kernel that is right at the
//   tests' small shapes and wrong at the real ones (grids, staging, tile edges) shows here;
// - attention at Qwen3-4B heads (32/8 of 128), T = 256, causal and as a packed prefix tree:
//   forward, log-sum-exp and backward against test/helpers/reference.ts (f64).
// Budgets: the fixtures' own, or f16's where this GPU's 'auto' takes the f16 GEMM
// (test/helpers/gemmBudget.ts); each line prints the error against its budget.
import '../bin/gpu-env.mjs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { generate, GREEDY } from '../src/model/generate.ts';
import { loadQwen3 } from '../src/model/load.ts';
import { dequantizeQ4, quantizeQ4 } from '../src/model/q4.ts';
import { openSafetensorsModel } from '../src/model/safetensors.ts';
import { nodeFolderSource } from '../src/model/sources.node.ts';
import { memorySource } from '../src/model/sources.ts';
import * as K from '../src/ops/index.ts';
import { crossEntropyLoss } from '../src/train/pgLoss.ts';
import { TrainingPass } from '../src/train/trainingPass.ts';
import { F16_GEMM_REL, goldenBudget } from '../test/helpers/gemmBudget.ts';
import { logitsOf } from '../test/helpers/logits.ts';
import { loadLoraGolden, ROOT } from '../test/helpers/loraGolden.ts';
import * as ref from '../test/helpers/reference.ts';

export interface CheckLine {
  name: string;
  /** The measured error (relative to the reference's scale unless `what` says otherwise). */
  error: number;
  budget: number;
  what: string;
  ok: boolean;
}

const GOLDEN = join(ROOT, 'test/fixtures/golden');
const GOLDEN_Q4 = join(ROOT, 'test/fixtures/golden-q4');
const f32File = async (path: string) => new Float32Array((await readFile(path)).buffer.slice(0));
const json = async <T>(path: string) => JSON.parse(await readFile(path, 'utf8')) as T;

/** max |a - b| / scale, or Infinity when any value is not finite or the lengths differ. */
export function relErr(got: ArrayLike<number>, want: ArrayLike<number>, scale: number): number {
  if (got.length !== want.length) return Infinity;
  let m = 0;
  for (let i = 0; i < want.length; i++) {
    const d = Math.abs(got[i]! - want[i]!);
    if (!(d <= m)) m = Number.isNaN(d) ? Infinity : d;
  }
  return m / scale;
}

function maxAbs(x: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < x.length; i++) m = Math.max(m, Math.abs(x[i]!));
  return m;
}

/** Every check, in order; `log` gets one line per check as it finishes. */
export async function gpuCheck(
  gpu: Gpu,
  log: (line: string) => void,
  only: { golden?: string[]; lora?: string[]; q4?: string[]; matmul?: boolean; attention?: boolean } = {},
): Promise<CheckLine[]> {
  const lines: CheckLine[] = [];
  const add = (name: string, error: number, budget: number, what: string) => {
    const line = { name, error, budget, what, ok: error <= budget };
    lines.push(line);
    log(`${line.ok ? 'ok  ' : 'FAIL'} ${name}: ${error.toExponential(2)} ${what} (budget ${budget.toExponential(1)})`);
  };
  // A check that throws (a kernel that does not compile or validate here) is a failed line, and
  // the others still run.
  const guard = async (name: string, fn: () => Promise<void>) => {
    try {
      await fn();
    } catch (e) {
      lines.push({ name, error: Infinity, budget: 0, what: `threw: ${(e as Error).message}`, ok: false });
      log(`FAIL ${name}: threw: ${(e as Error).message}`);
    }
  };
  const budget = goldenBudget(gpu);

  for (const variant of only.golden ?? ['tied', 'untied-sharded', 'mha'])
    await guard(`golden ${variant}`, async () => {
      const dir = join(GOLDEN, variant);
      const exp = await json<{
        tokens: number[];
        shape: [number, number];
        max_abs_logit: number;
        tolerance: { rel: number };
      }>(join(dir, 'expected.json'));
      const { model } = await loadQwen3(gpu, nodeFolderSource(dir));
      const got = await logitsOf(model, exp.tokens);
      const err = relErr(got, await f32File(join(dir, 'logits.f32')), exp.max_abs_logit);
      add(
        `golden ${variant}: logits, ${exp.tokens.length}-token prefill`,
        err,
        Math.max(exp.tolerance.rel, budget.logits),
        'x max|ref|',
      );
      const g = await json<{ prompt: number[]; tokens: number[] }>(join(dir, 'greedy.json'));
      const out: number[] = [];
      for await (const step of generate(model, [g.prompt], { ...GREEDY, maxNewTokens: g.tokens.length, stopIds: [] }))
        out.push(step[0]!.id);
      const same = out.findIndex((id, i) => id !== g.tokens[i]);
      add(
        `golden ${variant}: ${g.tokens.length} greedy tokens`,
        same < 0 ? 0 : g.tokens.length - same,
        0,
        'tokens differ from the first mismatch on',
      );
    });

  for (const variant of only.lora ?? ['tied-all', 'untied-rslora'])
    await guard(`LoRA ${variant}`, async () => {
      const { dir, ref: r, model, adapter } = await loadLoraGolden(gpu, variant);
      const logits = await logitsOf(model, r.tokens);
      add(
        `LoRA ${variant}: logits`,
        relErr(logits, await f32File(join(dir, 'logits.f32')), r.max_abs_logit),
        budget.logits,
        'x max|ref|',
      );
      const pass = new TrainingPass(model, adapter, r.tokens, [...r.tokens.slice(1), -1]);
      const { loss, dlogp } = crossEntropyLoss(await pass.forward());
      add(`LoRA ${variant}: loss`, Math.abs(loss - r.loss) / r.loss, budget.loss, 'relative');
      pass.backward(dlogp);
      pass.release();
      const grads = await adapter.getTensors('grads');
      const st = await openSafetensorsModel(
        memorySource(
          'grads',
          new Map([['model.safetensors', new Uint8Array(await readFile(join(dir, 'grads.safetensors')))]]),
        ),
      );
      let worst = 0;
      for (const name of st.tensors.keys()) {
        const b = await st.readTensor(name);
        const want = new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
        const mine = grads.get(name);
        worst = Math.max(worst, mine ? relErr(mine, want, maxAbs(want)) : Infinity);
      }
      add(`LoRA ${variant}: every LoRA gradient`, worst, budget.grad, 'x max|g_ref| (worst tensor)');
      adapter.destroy();
    });

  for (const variant of only.q4 ?? ['tied', 'untied-sharded', 'mha'])
    await guard(`q4 ${variant}`, async () => {
      const exp = await json<{
        tokens: number[];
        shape: [number, number];
        max_abs_logit: number;
        tolerance: { rel: number };
      }>(join(GOLDEN_Q4, variant, 'expected.json'));
      const { model } = await loadQwen3(gpu, nodeFolderSource(join(GOLDEN, variant)), { weights: 'q4' });
      const got = await logitsOf(model, exp.tokens);
      const err = relErr(got, await f32File(join(GOLDEN_Q4, variant, 'logits.f32')), exp.max_abs_logit);
      add(`q4 ${variant}: logits`, err, Math.max(exp.tolerance.rel, budget.logits), 'x max|q4 ref|');
    });

  if (only.matmul ?? true) {
    for (const [N, Kd] of [
      [9728, 2560],
      [2560, 9728],
    ] as const) {
      const rand = ref.rng(N);
      const values = ref.randn(N * Kd, rand, 0.02);
      const bits = new Uint16Array(N * Kd);
      for (let i = 0; i < bits.length; i++) bits[i] = ref.f32ToBf16(values[i]!);
      const bf16 = new Float32Array(N * Kd);
      for (let i = 0; i < bits.length; i++) bf16[i] = ref.bf16ToF32(bits[i]!);
      const packed = quantizeQ4(bits, N, Kd, 'w');
      for (const format of ['bf16', 'q4'] as const)
        await guard(`matmul ${format} ${N}x${Kd}`, async () => {
          const bytes = format === 'bf16' ? new Uint32Array(bits.buffer) : packed;
          const wb = gpu.createBuffer(bytes.byteLength, `w ${format}`);
          gpu.write(wb, bytes);
          const w: K.Weight = format === 'bf16' ? wb : { format: 'q4', buf: wb, N, K: Kd };
          const deq = format === 'bf16' ? bf16 : dequantizeQ4(packed, N, Kd);
          for (const M of [1, 4, 32]) {
            const x = ref.randn(M * Kd, rand);
            const xb = gpu.createBuffer(x.byteLength, 'x');
            gpu.write(xb, x);
            const out = gpu.createBuffer(M * N * 4, 'out');
            K.matmul(gpu, out, xb, w, M, N, Kd);
            const label = K.kernelVariant(gpu, 'matmul')!.label;
            const got = await gpu.readF32(out, M * N);
            const want = new Float32Array(M * N);
            ref.matmul(want, x, deq, M, N, Kd);
            // f32 sums of ~10^4 products; the f16 GEMM's own budget where it ran.
            const f16 = /F16=1/.test(label);
            add(
              `matmul ${format} M=${M} N=${N} K=${Kd} (${label})`,
              relErr(got, want, maxAbs(want)),
              f16 ? F16_GEMM_REL : 1e-5,
              'x max|ref|',
            );
            gpu.releaseBuffer(xb);
            gpu.releaseBuffer(out);
          }
          gpu.releaseBuffer(wb);
        });
    }
  }

  if (only.attention ?? true) {
    // Qwen3-4B's heads; T = 256 takes the query-tiled kernels on every adapter ('auto').
    const [T, NH, NKV, HD] = [256, 32, 8, 128];
    // A packed prefix tree: a 96-token prefix, then branches of 64, 32 and 64 tokens.
    const keyEnd = [...Array(96).fill(T), ...Array(64).fill(160), ...Array(32).fill(192), ...Array(64).fill(T)];
    for (const [name, ends] of [
      ['causal', undefined],
      ['packed tree', keyEnd],
    ] as const)
      await guard(`attention ${name}`, async () => {
        const rand = ref.rng(2026);
        const q = ref.randn(T * NH * HD, rand);
        const k = ref.randn(T * NKV * HD, rand);
        const v = ref.randn(T * NKV * HD, rand);
        const dout = ref.randn(T * NH * HD, rand);
        const buf = (x: Float32Array, label: string) => {
          const b = gpu.createBuffer(x.byteLength, label);
          gpu.write(b, x);
          return b;
        };
        const [qb, kb, vb, db] = [buf(q, 'q'), buf(k, 'k'), buf(v, 'v'), buf(dout, 'dout')];
        const zeros = (n: number, label: string) => buf(new Float32Array(n), label);
        let ke: GPUBuffer | undefined;
        if (ends) {
          ke = gpu.createBuffer(T * 4, 'keyEnd');
          gpu.write(ke, Uint32Array.from(ends));
        }
        const out = gpu.createBuffer(q.byteLength, 'out');
        const lse = gpu.createBuffer(T * NH * 4, 'lse');
        K.attentionForwardLse(gpu, out, lse, qb, kb, vb, T, NH, NKV, HD, ke);
        const [dq, dk, dv] = [zeros(q.length, 'dq'), zeros(k.length, 'dk'), zeros(v.length, 'dv')];
        K.attentionBackward(gpu, dq, dk, dv, db, out, lse, qb, kb, vb, T, NH, NKV, HD, ke);
        const wantOut = new Float64Array(q.length);
        const wantLse = new Float64Array(T * NH);
        ref.attentionForwardLse(wantOut, wantLse, q, k, v, T, NH, NKV, HD, ends);
        const want = { dq: new Float64Array(q.length), dk: new Float64Array(k.length), dv: new Float64Array(v.length) };
        ref.attentionBackward(want.dq, want.dk, want.dv, dout, wantOut, wantLse, q, k, v, T, NH, NKV, HD, ends);
        const variant = `${K.kernelVariant(gpu, 'attentionForwardLse')!.label}; ${K.kernelVariant(gpu, 'attentionBackward')!.label}`;
        const fwd = Math.max(
          relErr(await gpu.readF32(out, q.length), wantOut, maxAbs(wantOut)),
          relErr(await gpu.readF32(lse, T * NH), wantLse, maxAbs(wantLse)),
        );
        add(`attention ${name} T=${T} 32/8x128: forward and lse (${variant})`, fwd, 1e-5, 'x max|ref|');
        let back = 0;
        for (const [key, b] of [
          ['dq', dq],
          ['dk', dk],
          ['dv', dv],
        ] as const)
          back = Math.max(back, relErr(await gpu.readF32(b, want[key].length), want[key], maxAbs(want[key])));
        add(`attention ${name} T=${T} 32/8x128: dq, dk, dv`, back, 2e-5, 'x max|ref| (worst)');
        for (const b of [qb, kb, vb, db, out, lse, dq, dk, dv, ...(ke ? [ke] : [])]) gpu.releaseBuffer(b);
      });
  }
  return lines;
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('gpu-check.mjs')) {
  const { values } = parseArgs({ options: { kernels: { type: 'string' }, json: { type: 'string' } } });
  if (values.kernels) K.resetTuning(K.parseTuning(values.kernels));
  const gpu = await createGpu();
  console.log(
    `gpu-check on ${gpu.info.description || gpu.info.architecture} (${gpu.info.vendor}); 'auto' as on ${K.autoForCpu(gpu) ? 'a CPU adapter' : 'a GPU'}; shader-f16 ${gpu.features.f16}, subgroups ${gpu.features.subgroups}; f16 GEMM ${K.useGemmF16(gpu)}; ${gpu.limits.maxStorageBuffersPerShaderStage} storage buffers a stage`,
  );
  const lines = await gpuCheck(gpu, (l) => console.log(l));
  const failed = lines.filter((l) => !l.ok).length;
  console.log(
    failed ? `gpu-check: ${failed} of ${lines.length} checks FAILED` : `gpu-check: all ${lines.length} checks passed`,
  );
  if (values.json) await writeFile(values.json, JSON.stringify({ gpu: gpu.info, lines }, null, 2));
  gpu.destroy();
  process.exit(failed ? 1 : 0);
}
