import { it, expect, beforeAll } from 'vitest';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import * as K from '../src/model/kernels.ts';
let gpu: Gpu;
beforeAll(async () => { gpu = await createGpu(); console.log('created'); });
it('x', async () => {
  const x = gpu.createBuffer(16, 'b');
  gpu.write(x, new Float32Array([1,2,3,4]));
  const w = gpu.createBuffer(16, 'w');
  gpu.write(w, new Uint32Array([0x3f803f80,0x3f803f80,0x3f803f80,0x3f803f80]));
  const o = gpu.createBuffer(8, 'o');
  console.log('pre');
  K.matmul(gpu, o, x, w, 1, 2, 4);
  console.log('dispatched');
  console.log(await gpu.readF32(o));
  expect(1).toBe(1);
});
