// `npx tsx bench/gemm-ab.ts [--M 256] [--N 1024] [--K 2560] [--reps 5] [--f16] [--subgroups]
//  [--vec4 auto|off] [--weights bf16|q4] [--split-k auto|on|off] [--kernels name=value,...] [--json FILE]`
// The tiled GEMM (shaders/matmul.wgsl gemm_tiled, forced: tuning.matmul 'tiled') in the three
// layouts the model runs it in, timed in this tree: the forward `matmul` (x . W^T, bf16 W), the
// input gradient `matmulBackwardInput` (dy . W, W read along its columns) and the LoRA weight
// gradient `matmulBackwardWeightF32` (dy^T . x, both read along M). For a change to the kernel,
// run it in two checkouts (the base one a `git clone` with node_modules linked) alternately, A B A
// B, and compare: this file imports only the ops layer, so it runs unchanged in older trees.
// --f16 times the forward with f16 tiles (tuning.gemmF16 'on'; needs shader-f16); --subgroups
// shares A by subgroup shuffles (tuning.gemmSubgroups 'on': the forward and the input gradient;
// 'off' without the flag); --vec4 off keeps the forward and the input gradient on the r-major
// tiles with element loads (tuning.gemmVec4; the default, auto, takes the 16-byte loads where
// they fit). Each figure is the best of 3 batches of --reps calls, with GFLOP/s; on a CPU adapter
// these are CPU timings of GPU kernels. --weights q4 times the products over a q4 W (as the
// model's q4 runs them; default bf16), --split-k sets tuning.gemmSplitK (default auto: the
// product sliced over R where its tiles are fewer than 128; 'on' slices every one in two at
// least). --kernels sets any other switch last, as the CLI's does (e.g. gemmQ4Dequant=on: the q4
// weight dequantized to an f32 copy before each product, that pass timed with it). A benchmark,
// not a test: nothing here asserts a time.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import * as K from '../src/ops/index.ts';

const { values } = parseArgs({
  options: {
    M: { type: 'string', default: '256' },
    N: { type: 'string', default: '1024' },
    K: { type: 'string', default: '2560' },
    reps: { type: 'string', default: '5' },
    f16: { type: 'boolean', default: false },
    subgroups: { type: 'boolean', default: false },
    vec4: { type: 'string', default: 'auto' },
    weights: { type: 'string', default: 'bf16' },
    'split-k': { type: 'string', default: 'auto' },
    kernels: { type: 'string', default: '' },
    json: { type: 'string' },
  },
});
const [M, N, Kd, reps] = [values.M, values.N, values.K, values.reps].map(Number) as [number, number, number, number];
const gpu = await createGpu();
try {
  const adapter = `${gpu.info.vendor} ${gpu.info.architecture} ${gpu.info.description}`.trim();
  K.tuning.matmul = 'tiled';
  K.tuning.gemmF16 = values.f16 ? 'on' : 'off';
  Object.assign(K.tuning, { gemmSubgroups: values.subgroups ? 'on' : 'off' }); // older trees lack the switch
  Object.assign(K.tuning, { gemmVec4: values.vec4 }); // so do trees before the 16-byte loads
  Object.assign(K.tuning, K.parseTuning(`gemmSplitK=${values['split-k']}`)); // and before split-K
  if (values.kernels) Object.assign(K.tuning, K.parseTuning(values.kernels));
  if (values.weights !== 'bf16' && values.weights !== 'q4') throw new Error('--weights: bf16 or q4');
  const filled = (n: number, label: string) => {
    const b = gpu.createBuffer(n * 4, label);
    gpu.write(
      b,
      Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * 0.5),
    );
    return b;
  };
  // The bf16 weight's words are sin values read as bf16 pairs: finite, O(1). The q4 one's nibble
  // words are the same bits, its scales (the words from N K / 8 on) 2^-4 each.
  const x = filled(M * Kd, 'x');
  let w: K.Weight = filled((N * Kd) / 2, 'w bf16');
  if (values.weights === 'q4') {
    const words = K.q4Words(N, Kd);
    const buf = filled(words, 'w q4');
    gpu.write(buf, new Uint32Array(words - (N * Kd) / 8).fill(0x2c002c00), ((N * Kd) / 8) * 4);
    w = { format: 'q4', buf, N, K: Kd };
  }
  const out = filled(M * N, 'out');
  const dy = filled(M * N, 'dy');
  const dx = filled(M * Kd, 'dx');
  const dw = filled(N * Kd, 'dw');
  const layouts: [string, () => void][] = [
    ['matmul (x . W^T)', () => K.matmul(gpu, out, x, w, M, N, Kd)],
    ['matmulBackwardInput (dy . W)', () => K.matmulBackwardInput(gpu, dx, dy, w, M, N, Kd, false)],
    ['matmulBackwardWeightF32 (dy^T . x)', () => K.matmulBackwardWeightF32(gpu, dw, dy, x, M, N, Kd)],
  ];
  const flop = 2 * M * N * Kd;
  const records = [];
  console.log(
    `${adapter}; M ${M} N ${N} K ${Kd}; ${values.f16 ? 'f16' : 'f32'} tiles in the forward; ` +
      `A ${values.subgroups ? 'by subgroup shuffles' : 'in shared memory'}; gemmVec4 ${values.vec4}; ` +
      `${values.weights} W; gemmSplitK ${values['split-k']}${values.kernels ? `; kernels ${values.kernels}` : ''}`,
  );
  for (const [name, call] of layouts) {
    call();
    await gpu.sync();
    let best = Infinity;
    for (let j = 0; j < 3; j++) {
      const t0 = performance.now();
      for (let r = 0; r < reps; r++) call();
      await gpu.sync();
      best = Math.min(best, (performance.now() - t0) / 1000 / reps);
    }
    const gflops = flop / best / 1e9;
    const defines = K.kernelVariant?.(gpu, name.split(' ')[0]!)?.defines ?? {};
    records.push({ name, M, N, K: Kd, seconds: best, gflops, defines });
    console.log(
      `${name.padEnd(36)} ${(best * 1000).toFixed(2).padStart(9)} ms  ${gflops.toFixed(2).padStart(8)} GFLOP/s  ` +
        Object.entries(defines)
          .map(([k, v]) => `${k}=${v}`)
          .join(' '),
    );
  }
  if (values.json)
    writeFileSync(
      values.json,
      JSON.stringify({ adapter, f16: values.f16, subgroups: values.subgroups, vec4: values.vec4, records }, null, 2),
    );
} finally {
  gpu.destroy();
}
