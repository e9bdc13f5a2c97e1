// Side by side, one process: training's input gradient dx = dy . W through gemm_rows (tuning 'rows',
// the kernel before gemv_cols) and gemv_cols ('blocks'), alternated. A benchmark: asserts nothing.
//   npx tsx bench/dx-ab.ts '[[32,1024,2560,"bf16"],[32,1024,2560,"q4"],[16,151936,64,"bf16"]]' 3
import '../bin/gpu-env.mjs';
import { createGpu } from '../src/gpu/index.ts';
import * as K from '../src/ops/index.ts';
const gpu = await createGpu();
const shapes = JSON.parse(process.argv[2] ?? '[[32,1024,2560,"bf16"]]') as [number, number, number, string][];
const reps = Number(process.argv[3] ?? 3);
for (const [M, N, Kd, fmt] of shapes) {
  const dy = gpu.createBuffer(M * N * 4, 'dy');
  const dx = gpu.createBuffer(M * Kd * 4, 'dx');
  gpu.write(dy, new Float32Array(M * N).fill(0.01));
  const bytes = fmt === 'q4' ? K.q4Words(N, Kd) * 4 : N * Kd * 2;
  const buf = gpu.createBuffer(Math.ceil(bytes / 16) * 16, 'w');
  const w: K.Weight = fmt === 'q4' ? { format: 'q4', buf, N, K: Kd } : buf;
  const time = async (v: 'rows' | 'blocks') => {
    K.tuning.matmul = v;
    K.matmulBackwardInput(gpu, dx, dy, w, M, N, Kd);
    await gpu.read(dx, 4);
    const t0 = performance.now();
    K.matmulBackwardInput(gpu, dx, dy, w, M, N, Kd);
    await gpu.read(dx, 4);
    return performance.now() - t0;
  };
  const r: Record<string, number[]> = { rows: [], blocks: [] };
  for (let i = 0; i < reps; i++) {
    r.rows.push(await time('rows'));
    r.blocks.push(await time('blocks'));
  }
  const med = (a: number[]) => [...a].sort((x, y) => x - y)[a.length >> 1];
  console.log(
    `dx ${fmt} M=${M} N=${N} K=${Kd}: gemm_rows ${r.rows.map((x) => x.toFixed(0)).join('/')} ms, gemv_cols ${r.blocks.map((x) => x.toFixed(0)).join('/')} ms, ratio ${(med(r.rows) / med(r.blocks)).toFixed(2)}x`,
  );
}
gpu.destroy();
