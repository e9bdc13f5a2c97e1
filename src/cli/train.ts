// `spyrl grad` and `spyrl sft`: LoRA gradients and a supervised LoRA fine-tune on the same engine.
import { readFile, rename, writeFile } from 'node:fs/promises';
import { ModelLoadError } from '../model/errors.ts';
import { bool, ENGINE_FLAGS, engineOptions, int, num, parse, str, UsageError, type Flags } from './args.ts';
import { inputIds, openModel, requireDir } from './open.ts';

export async function gradCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, { model: { type: 'string' }, adapter: { type: 'string' }, tokens: { type: 'string' }, text: { type: 'string' }, out: { type: 'string' }, ...ENGINE_FLAGS });
  const dir = str(f, 'model', true)!;
  const adapterDir = str(f, 'adapter', true)!;
  const file = str(f, 'out', true)!;
  if ((str(f, 'tokens') === undefined) === (f.text === undefined)) throw new UsageError('give exactly one of --tokens or --text');
  const { gpu, model, cfg, tokenizer } = await openModel(dir, adapterDir, engineOptions(f));
  try {
    const ids = inputIds(f, tokenizer, dir, cfg.vocabSize);
    if (ids.length < 2) throw new UsageError('the loss needs at least 2 tokens (each predicts the next)');
    const [{ TrainingPass }, { crossEntropyLoss }, { writeSafetensors }, { loraPrefix }] = await Promise.all([
      import('../train/trainingPass.ts'), import('../train/pgLoss.ts'), import('../model/safetensors.ts'), import('../model/peft.ts'),
    ]);
    const adapter = model.lora!;
    const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1]);
    const { loss, dlogp } = crossEntropyLoss(await pass.forward());
    pass.backward(dlogp);
    pass.release();
    const grads = await adapter.getTensors('grads');
    const shapes = new Map(adapter.pairs.flatMap((p) => {
      const pre = loraPrefix(p.layer, p.target);
      return [[`${pre}.lora_A.weight`, [adapter.settings.r, p.K]], [`${pre}.lora_B.weight`, [p.N, adapter.settings.r]]] as [string, number[]][];
    }));
    const bytes = writeSafetensors(
      [...grads.keys()].sort().map((name) => ({ name, dtype: 'F32' as const, shape: shapes.get(name)!, data: new Uint8Array(grads.get(name)!.buffer) })),
      { format: 'pt' },
    );
    const tmp = `${file}.partial-${process.pid}`;
    await writeFile(tmp, bytes);
    await rename(tmp, file);
    out.write(JSON.stringify({ loss }) + '\n');
  } finally {
    gpu.destroy();
  }
}

function progressBar(done: number, total: number, width = 24): string {
  const n = Math.round((done / total) * width);
  return `[${'#'.repeat(n)}${'.'.repeat(width - n)}]`;
}

function fmtTime(s: number): string {
  if (!Number.isFinite(s)) return '?';
  return s >= 3600 ? `${Math.floor(s / 3600)}h${Math.round((s % 3600) / 60)}m` : s >= 60 ? `${Math.floor(s / 60)}m${Math.round(s % 60)}s` : `${s.toFixed(0)}s`;
}

export async function sftCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f: Flags = parse(args, {
    model: { type: 'string' }, 'text-file': { type: 'string' }, steps: { type: 'string' }, out: { type: 'string' },
    lr: { type: 'string' }, r: { type: 'string' }, alpha: { type: 'string' }, rslora: { type: 'string' }, targets: { type: 'string' },
    'seq-len': { type: 'string' }, batch: { type: 'string' }, schedule: { type: 'string' }, warmup: { type: 'string' },
    'max-grad-norm': { type: 'string' }, 'weight-decay': { type: 'string' }, seed: { type: 'string' }, resume: { type: 'string' },
    'gpu-memory': { type: 'string' }, ...ENGINE_FLAGS,
  });
  const dir = str(f, 'model', true)!;
  const textFile = str(f, 'text-file', true)!;
  const outDir = str(f, 'out', true)!;
  const steps = int(f, 'steps', 0, 1);
  if (!str(f, 'steps')) throw new UsageError('--steps is required');
  const seqLen = int(f, 'seq-len', 128, 2);
  const batch = int(f, 'batch', 1, 1);
  const seed = int(f, 'seed', 0, 0);
  const lr = num(f, 'lr', 2e-4);
  if (!(lr > 0)) throw new UsageError('--lr must be > 0');
  const scheduleKind = str(f, 'schedule') ?? 'constant';
  if (scheduleKind !== 'constant' && scheduleKind !== 'cosine') throw new UsageError('--schedule must be constant or cosine');
  const warmup = int(f, 'warmup', 0, 0);
  const resumeDir = str(f, 'resume');
  const budget = str(f, 'gpu-memory') === undefined ? undefined : num(f, 'gpu-memory', 0) * 2 ** 30;

  const text = await readFile(textFile, 'utf8').catch((e: NodeJS.ErrnoException) => {
    throw new ModelLoadError(textFile, e.code === 'ENOENT' ? 'text file not found' : `cannot read: ${e.message}`);
  });
  if (!text.trim()) throw new ModelLoadError(textFile, 'is empty');
  if (resumeDir) await requireDir(resumeDir, 'resume folder');

  const [{ loraConfig, initLora, readAdapter, readOptimizerState, writeAdapter, writeOptimizerState, LORA_TARGETS }, { LoraAdapter }, { LoraAdamW, DEFAULT_ADAMW }, { packSequences, epochOrder, sftStep }, { planSft, checkPlanFits }, { nodeFolderSource }, { writeFolder }] =
    await Promise.all([
      import('../model/peft.ts'), import('../model/lora.ts'), import('../train/optimizer.ts'), import('../train/sft.ts'),
      import('../train/memory.ts'), import('../model/sources.node.ts'), import('../model/peft.node.ts'),
    ]);

  const engine = engineOptions(f);
  const { gpu, model, cfg, tokenizer } = await openModel(dir, undefined, engine);
  try {
    if (!tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${dir}: sft needs the tokenizer files`);
    let lora;
    let weights;
    if (resumeDir) {
      ({ lora, tensors: weights } = await readAdapter(nodeFolderSource(resumeDir), cfg));
    } else {
      const targets = (str(f, 'targets') ?? LORA_TARGETS.join(',')).split(',').map((t) => t.trim()).filter(Boolean);
      try {
        lora = loraConfig({ r: int(f, 'r', 8, 1), alpha: num(f, 'alpha', 16), useRslora: bool(f, 'rslora', false), targetModules: targets as never, baseModel: dir });
      } catch (e) {
        throw new UsageError((e as Error).message);
      }
      weights = initLora(cfg, lora, seed);
    }
    checkPlanFits(planSft(cfg, { weights: engine.weights, lora: { r: lora.r, targets: lora.targetModules }, seqLen }), gpu.limits, budget);

    const windows = packSequences(tokenizer.encode(text), seqLen);
    if (windows.length === 0) throw new ModelLoadError(textFile, 'has fewer than 2 tokens');
    const adapter = new LoraAdapter(gpu, cfg, lora);
    adapter.setWeights(weights);
    model.lora = adapter;
    const settings = {
      ...DEFAULT_ADAMW, lr,
      maxGradNorm: num(f, 'max-grad-norm', DEFAULT_ADAMW.maxGradNorm),
      weightDecay: num(f, 'weight-decay', DEFAULT_ADAMW.weightDecay),
      schedule: scheduleKind === 'cosine' ? { kind: 'cosine' as const, warmup, total: steps, minLr: 0 } : { kind: 'constant' as const, warmup },
    };
    const opt = new LoraAdamW(gpu, adapter, settings);
    if (resumeDir) {
      const state = await readOptimizerState(nodeFolderSource(resumeDir), weights);
      const extra = state.extra as { seed?: number; seqLen?: number; batch?: number };
      if (extra.seqLen !== seqLen || extra.batch !== batch || extra.seed !== seed) {
        throw new UsageError(`--resume: the run used --seq-len ${extra.seqLen} --batch ${extra.batch} --seed ${extra.seed}; pass the same values to continue it exactly`);
      }
      opt.setState(state);
    }
    if (opt.step >= steps) throw new UsageError(`the resumed run has already taken ${opt.step} steps; ask for more than that with --steps`);

    const n = windows.length;
    const firstStep = opt.step + 1;
    const tty = (process.stderr as { isTTY?: boolean }).isTTY;
    const started = performance.now();
    let tokensSeen = 0;
    out.write(`sft: ${n} windows of <= ${seqLen} tokens, batch ${batch}, LoRA r=${lora.r} alpha=${lora.alpha} on ${lora.targetModules.join(',')} (${adapter.numParams.toLocaleString()} params), lr ${lr} ${scheduleKind}\n`);
    for (let step = opt.step + 1; step <= steps; step++) {
      // The windows of a step follow from the step number alone, so a resumed run sees the same data.
      const picked = Array.from({ length: batch }, (_, i) => {
        const g = (step - 1) * batch + i;
        return windows[epochOrder(n, seed, Math.floor(g / n))[g % n]];
      });
      const res = await sftStep(model, adapter, opt, picked);
      tokensSeen += res.tokens;
      const elapsed = (performance.now() - started) / 1000;
      const eta = (elapsed / (step - firstStep + 1)) * (steps - step);
      const line = `step ${step}/${steps}  loss ${res.loss.toFixed(4)}  grad-norm ${res.gradNorm.toPrecision(4)}  lr ${res.lr.toExponential(2)}  ${(tokensSeen / elapsed).toFixed(1)} tok/s${res.skipped ? `  SKIPPED: ${res.reason}` : ''}`;
      if (tty) process.stderr.write(`\r\x1b[2K`);
      out.write(line + '\n');
      if (tty) process.stderr.write(`${progressBar(step, steps)} ${step}/${steps} ETA ${fmtTime(eta)}`);
    }
    if (tty) process.stderr.write('\n');
    const state = await opt.getState();
    const files = {
      ...writeAdapter(lora, await adapter.getTensors('weights'), cfg),
      ...writeOptimizerState({ step: state.step, m: state.m, v: state.v, extra: { seed, seqLen, batch, lr, schedule: scheduleKind, warmup } }),
    };
    await writeFolder(outDir, files);
    out.write(`wrote ${Object.keys(files).join(', ')} to ${outDir}\n`);
  } finally {
    gpu.destroy();
  }
}
