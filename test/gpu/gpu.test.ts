// The GPU layer (src/gpu): buffers, upload/readback, the pool, uniform params, grid splitting,
// and typed errors. One Gpu for the file; test-only WGSL comes in through the shaderSource hook.

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { shaderSource } from '#shaders';
import {
  createGpu,
  f32,
  splitGrid,
  GpuDeviceLostError,
  GpuError,
  GpuOutOfMemoryError,
  GpuValidationError,
  type Gpu,
  bufferSize,
  bufferUsage,
  objectId,
} from '../../src/gpu/index.ts';
import * as K from '../../src/ops/index.ts';
import { MAX_PARAM_DISPATCHES_PER_SUBMIT } from '../../src/gpu/device.ts';
import { UNIFORM_ARENA_BYTES } from '../../src/train/memory.ts';

const TEST_WGSL = `
struct SetParams { i: u32, value: f32 }
@group(0) @binding(0) var<uniform> p: SetParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (n) f32

// out[p.i] = p.value: one dispatch per element checks every dispatch got its own params slot.
@compute @workgroup_size(1)
fn set_one() { out[p.i] = p.value; }

@group(0) @binding(2) var<storage, read_write> src: array<f32>; // (n) f32

// out[p.i] = src[p.i] + p.value: two storage buffers, bound in the order the dispatch gives them.
@compute @workgroup_size(1)
fn add_from() { out[p.i] = src[p.i] + p.value; }

@group(0) @binding(1) var<storage, read_write> ids: array<u32>; // (n) u32

// ids[i] = i + 1 for the linear workgroup id, so a wrong or missing part of the grid shows.
@compute @workgroup_size(1)
fn write_ids(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u) {
  let i = wid.x + wid.y * nwg.x;
  if (i < arrayLength(&ids)) { ids[i] = i + 1u; }
}
`;

// Per invocation of one 256-wide workgroup: [subgroup_invocation_id, subgroup_size,
// subgroupAdd(1), subgroupMin(local_invocation_index)], what the subgroup kernels assume.
const SUBGROUP_PROBE_WGSL = `
enable subgroups;
@group(0) @binding(1) var<storage, read_write> o: array<u32>; // (256, 4); binding 0 is the params slot, unused
@compute @workgroup_size(256)
fn probe(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) lane: u32,
         @builtin(subgroup_size) size: u32) {
  let count = subgroupAdd(1u);
  let first = subgroupMin(lid);
  o[lid * 4u] = lane;
  o[lid * 4u + 1u] = size;
  o[lid * 4u + 2u] = count;
  o[lid * 4u + 3u] = first;
}
`;

let gpu: Gpu;

beforeAll(async () => {
  const testShaders: Record<string, string> = {
    test: TEST_WGSL,
    broken: '@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }',
    subgroupProbe: SUBGROUP_PROBE_WGSL,
  };
  gpu = await createGpu({ shaderSource: (name) => testShaders[name] ?? shaderSource(name) });
});

afterAll(() => gpu?.destroy());

describe('device', () => {
  it('reports adapter info, features and raised limits', () => {
    expect(typeof gpu.info.architecture).toBe('string');
    expect(typeof gpu.features.subgroups).toBe('boolean');
    expect(typeof gpu.features.f16).toBe('boolean');
    expect(gpu.limits.maxStorageBufferBindingSize).toBeGreaterThanOrEqual(128 * 2 ** 20);
    expect(gpu.limits.maxComputeWorkgroupsPerDimension).toBeGreaterThanOrEqual(65535);
  });

  it("keeps a plain copy of the device's limits, every attribute equal", () => {
    const native = gpu.device.limits;
    let n = 0;
    for (const name in native) {
      const v = (native as unknown as Record<string, unknown>)[name];
      if (typeof v !== 'number') continue;
      expect((gpu.limits as unknown as Record<string, number>)[name], name).toBe(v);
      n++;
    }
    expect(n).toBeGreaterThan(20);
  });

  it('SPYRL_GPU_FEATURES_OFF leaves the listed features off, together with disableFeatures; an unknown name is refused', async () => {
    const saved = process.env.SPYRL_GPU_FEATURES_OFF;
    try {
      process.env.SPYRL_GPU_FEATURES_OFF = ' subgroups,timestamp-query ';
      const off = await createGpu({ disableFeatures: ['shader-f16'] });
      expect(off.features).toEqual({ f16: false, subgroups: false, timestampQuery: false });
      off.destroy();
      delete process.env.SPYRL_GPU_FEATURES_OFF;
      const on = await createGpu();
      // What this adapter offers (SwiftShader and lavapipe both offer subgroups and timestamps).
      expect(on.features.subgroups).toBe(gpu.features.subgroups);
      expect(on.features.timestampQuery).toBe(gpu.features.timestampQuery);
      on.destroy();
      process.env.SPYRL_GPU_FEATURES_OFF = 'shader-f16,subgroup';
      await expect(createGpu()).rejects.toThrow(
        "SPYRL_GPU_FEATURES_OFF: unknown feature 'subgroup' (known: shader-f16, subgroups, timestamp-query)",
      );
    } finally {
      if (saved === undefined) delete process.env.SPYRL_GPU_FEATURES_OFF;
      else process.env.SPYRL_GPU_FEATURES_OFF = saved;
    }
  });
});

describe('subgroups', () => {
  // The subgroup kernels (common/reduce.wgsl, the split attention backward) take subgroup id =
  // local_invocation_index / subgroup_size, and the width from the subgroup_size builtin. A driver
  // that breaks either would give wrong sums silently: lavapipe with LP_NATIVE_VECTOR_WIDTH=1024
  // reports 32 while its subgroup operations span 16 lanes. npm test runs this on SwiftShader (4)
  // and lavapipe (8 and 16).
  it('span subgroup_size lanes, packed in local_invocation_index order, within the adapter limits', async (ctx) => {
    if (!gpu.features.subgroups) ctx.skip();
    const out = gpu.createBuffer(256 * 16, 'subgroup probe');
    gpu.dispatch(gpu.kernel('subgroupProbe', 'probe'), [out], 1);
    const r = new Uint32Array(await gpu.read(out));
    const size = r[1]!;
    expect(size, 'subgroup_size').toBeGreaterThanOrEqual(Math.max(1, gpu.info.subgroupMinSize));
    for (let lid = 0; lid < 256; lid++) {
      const [lane, sz, count, first] = [r[lid * 4]!, r[lid * 4 + 1]!, r[lid * 4 + 2]!, r[lid * 4 + 3]!];
      expect({ lid, sz, count, lane, first }).toEqual({
        lid,
        sz: size,
        count: size,
        lane: lid % size,
        first: lid - (lid % size),
      });
    }
    const want = process.env.SPYRL_EXPECT_SUBGROUP_SIZE;
    if (want) expect(size, 'SPYRL_EXPECT_SUBGROUP_SIZE').toBe(Number(want));
    gpu.releaseBuffer(out);
  });
});

describe('buffers', () => {
  it('write/read round trip, with offsets and odd byte counts', async () => {
    const buf = gpu.createBuffer(64, 'roundtrip');
    gpu.write(
      buf,
      Float32Array.from({ length: 16 }, (_, i) => i * 0.5),
    );
    gpu.write(buf, Uint32Array.from([0xdeadbeef]), 8);
    const all = new Float32Array(await gpu.read(buf));
    expect(all[0]).toBe(0);
    expect(all[15]).toBe(7.5);
    expect(new Uint32Array(all.buffer)[2]).toBe(0xdeadbeef);
    expect(Array.from(await gpu.readF32(buf, 2))).toEqual([0, 0.5]);
    expect(Array.from(new Float32Array(await gpu.read(buf, 8, 12)))).toEqual([1.5, 2]);
    gpu.write(buf, Uint8Array.from([1, 2, 3])); // padded to 4 bytes
    expect(Array.from(new Uint8Array(await gpu.read(buf, 4)))).toEqual([1, 2, 3, 0]);
  });

  it('pool recycles released buffers of the same size', () => {
    const a = gpu.createBuffer(1000, 'a');
    gpu.releaseBuffer(a);
    const b = gpu.createBuffer(1000, 'b');
    expect(b).toBe(a);
    expect(b.label).toBe('b');
    const c = gpu.createBuffer(1004, 'c');
    expect(c).not.toBe(a);
    // The sizes and usages the encode path reads once per buffer are the buffers' own.
    for (const buf of [b, c]) {
      expect(bufferSize(buf)).toBe(buf.size);
      expect(bufferUsage(buf)).toBe(buf.usage);
    }
    gpu.releaseBuffer(b);
    gpu.releaseBuffer(c);
    // An object that takes no property of ours keeps its size, usage and id all the same.
    const sealed = Object.freeze({ size: 48, usage: 12 }) as unknown as GPUBuffer;
    expect([bufferSize(sealed), bufferUsage(sealed)]).toEqual([48, 12]);
    expect(objectId(sealed)).toBe(objectId(sealed));
    expect(objectId(sealed)).not.toBe(objectId(a));
  });

  it('copy and clear are ordered with dispatches', async () => {
    const src = gpu.createBuffer(16, 'src');
    const dst = gpu.createBuffer(16, 'dst');
    gpu.write(src, Float32Array.from([1, 2, 3, 4]));
    gpu.copy(src, 4, dst, 0, 12);
    gpu.clear(src);
    expect(Array.from(await gpu.readF32(dst))).toEqual([2, 3, 4, 0]);
    expect(Array.from(await gpu.readF32(src))).toEqual([0, 0, 0, 0]);
  });

  it('a write after encoded work does not overtake it (flushes first)', async () => {
    const gate = gpu.createBuffer(16, 'gate');
    const up = gpu.createBuffer(16, 'up');
    const out = gpu.createBuffer(16, 'out');
    gpu.write(gate, Float32Array.from([0, 0, 0, 0]));
    gpu.write(up, Float32Array.from([2, 2, 2, 2]));
    K.siluMul(gpu, out, gate, up, 4); // silu(0) * 2 = 0
    gpu.write(gate, Float32Array.from([50, 50, 50, 50])); // would give 100 if run before the dispatch
    expect(Array.from(await gpu.readF32(out))).toEqual([0, 0, 0, 0]);
  });
});

describe('launch', () => {
  it('counts a pipeline per kernel variant first used, none for a cached one', () => {
    const before = gpu.pipelineCount;
    const k = gpu.kernel('test', 'write_ids', { PIPELINE_COUNT_PROBE: 1 });
    expect(gpu.pipelineCount).toBe(before + 1);
    expect(gpu.kernel('test', 'write_ids', { PIPELINE_COUNT_PROBE: 1 })).toBe(k);
    expect(gpu.pipelineCount).toBe(before + 1);
    gpu.kernel('test', 'write_ids', { PIPELINE_COUNT_PROBE: 2 }); // another variant of the same entry
    expect(gpu.pipelineCount).toBe(before + 2);
  });

  it('finds one kernel for the same defines in any order (the call-order lookup falls back to the sorted key)', () => {
    const before = gpu.pipelineCount;
    const ab = gpu.kernel('test', 'write_ids', { PIPELINE_ORDER_PROBE: 1, SECOND_PROBE: 2 });
    expect(gpu.kernel('test', 'write_ids', { SECOND_PROBE: 2, PIPELINE_ORDER_PROBE: 1 })).toBe(ab);
    expect(gpu.kernel('test', 'write_ids', { PIPELINE_ORDER_PROBE: 1, SECOND_PROBE: 2 })).toBe(ab);
    expect(gpu.pipelineCount).toBe(before + 1);
    expect(gpu.kernel('test', 'write_ids', { SECOND_PROBE: 3, PIPELINE_ORDER_PROBE: 1 })).not.toBe(ab);
  });

  it("finds a frozen defines object's kernel by identity, the same kernel as its content under any object", () => {
    const before = gpu.pipelineCount;
    const frozen = Object.freeze({ FROZEN_PROBE: 1, SECOND_PROBE: 4 });
    const k = gpu.kernel('test', 'write_ids', frozen);
    expect(gpu.kernel('test', 'write_ids', frozen)).toBe(k);
    expect(gpu.kernel('test', 'write_ids', { SECOND_PROBE: 4, FROZEN_PROBE: 1 })).toBe(k);
    expect(gpu.kernel('test', 'write_ids', Object.freeze({ FROZEN_PROBE: 1, SECOND_PROBE: 4 }))).toBe(k);
    expect(gpu.pipelineCount).toBe(before + 1);
    // The identity lookup still tells entries, shaders and constants apart.
    expect(gpu.kernel('test', 'set_one', frozen)).not.toBe(k);
    const norm = Object.freeze({});
    const k64 = gpu.kernel('rmsnorm', 'rmsnorm_forward', norm, { WG: 64 });
    expect(gpu.kernel('rmsnorm', 'rmsnorm_forward', norm, { WG: 64 })).toBe(k64);
    expect(gpu.kernel('rmsnorm', 'rmsnorm_forward', norm, { WG: 256 })).not.toBe(k64);
    expect(gpu.kernel('rmsnorm', 'rmsnorm_forward', {}, { WG: 64 })).toBe(k64);
  });

  it('gives every dispatch its own params across uniform chunks (600 dispatches, one flush)', async () => {
    const n = 600; // > 256 slots of one 64 KiB chunk
    const out = gpu.createBuffer(n * 4, 'set');
    const k = gpu.kernel('test', 'set_one');
    for (let i = 0; i < n; i++) gpu.dispatch(k, [out], 1, [i, f32(i * 0.25 - 3)]);
    const got = await gpu.readF32(out, n);
    expect(Array.from(got)).toEqual(Array.from({ length: n }, (_, i) => i * 0.25 - 3));
    // Next flush reuses the same uniform buffers with new values.
    for (let i = 0; i < n; i++) gpu.dispatch(k, [out], 1, [i, f32(i)]);
    expect(Array.from(await gpu.readF32(out, n))).toEqual(Array.from({ length: n }, (_, i) => i));
  });

  it('makes a bind group once per (kernel, buffers in order, params slot) and finds it again the next batch', async () => {
    const [a, b, c, d] = ['a', 'b', 'c', 'd'].map((n) => gpu.createBuffer(16, `bind-${n}`)) as [
      GPUBuffer,
      GPUBuffer,
      GPUBuffer,
      GPUBuffer,
    ];
    for (const buf of [a, b, c]) gpu.write(buf, new Float32Array(4)); // pooled buffers may hold old values
    gpu.write(d, new Float32Array([0, 100, 0, 0]));
    const set = gpu.kernel('test', 'set_one'),
      add = gpu.kernel('test', 'add_from'),
      ids = gpu.kernel('test', 'write_ids');
    // One batch: a params slot each, in order; write_ids has no params.
    const batch = async (first: GPUBuffer, second: GPUBuffer, src: GPUBuffer, v: number) => {
      const g0 = gpu.bindGroupCount;
      gpu.dispatch(set, [first], 1, [0, f32(v)]);
      gpu.dispatch(set, [second], 1, [0, f32(v + 1)]);
      gpu.dispatch(add, [a, src], 1, [1, f32(10)]); // a[1] = src[1] + 10
      gpu.dispatch(add, [b, a], 1, [1, f32(20)]); // b[1] = a[1] + 20
      gpu.dispatch(ids, [c], 1);
      const made = gpu.bindGroupCount - g0;
      const [ga, gb, gc] = [await gpu.readF32(a, 2), await gpu.readF32(b, 2), await gpu.readU32(c, 1)];
      return { made, a: Array.from(ga), b: Array.from(gb), c: gc[0] };
    };
    expect(await batch(a, b, b, 1)).toEqual({ made: 5, a: [1, 10], b: [2, 30], c: 1 });
    // The same dispatches after a submit: the arena hands out the same slots, every group is found.
    expect(await batch(a, b, b, 3)).toEqual({ made: 0, a: [3, 40], b: [4, 60], c: 1 });
    // The first two slots now bind the other buffers: two new groups, the rest found.
    expect(await batch(b, a, b, 5)).toEqual({ made: 2, a: [6, 70], b: [5, 90], c: 1 });
    // The same slot, kernel and first buffer with another second buffer: a group of its own.
    expect(await batch(b, a, d, 7)).toEqual({ made: 1, a: [8, 110], b: [7, 130], c: 1 });
    expect(await batch(b, a, b, 9)).toEqual({ made: 0, a: [10, 140], b: [9, 160], c: 1 });
    for (const buf of [a, b, c, d]) gpu.releaseBuffer(buf);
  });

  it('binds exactly the buffers of each dispatch across many (pipeline, buffers, slot) combinations', async () => {
    const n = 8;
    const src = Array.from({ length: n }, (_, j) => gpu.createBuffer(16, `combo-src-${j}`));
    for (let j = 0; j < n; j++) gpu.write(src[j]!, new Float32Array([0, 100 * j, 0, 0]));
    const dst = Array.from({ length: n * n }, (_, k) => gpu.createBuffer(16, `combo-dst-${k}`));
    const out = gpu.createBuffer(n * n * 4, 'combo-out');
    const add = gpu.kernel('test', 'add_from');
    // dst[i n + j][1] = src[j][1] + i: every (dst, src) pair a bind group of its own.
    const run = async () => {
      for (let i = 0; i < n; i++)
        for (let j = 0; j < n; j++) gpu.dispatch(add, [dst[i * n + j]!, src[j]!], 1, [1, f32(i)]);
      for (let k = 0; k < n * n; k++) gpu.copy(dst[k]!, 4, out, 4 * k, 4);
      return Array.from(await gpu.readF32(out, n * n));
    };
    const want = Array.from({ length: n * n }, (_, k) => 100 * (k % n) + Math.floor(k / n));
    const g0 = gpu.bindGroupCount;
    expect(await run()).toEqual(want);
    expect(gpu.bindGroupCount - g0).toBe(n * n);
    for (let j = 0; j < n; j++) gpu.write(src[j]!, new Float32Array([0, 1000 * j, 0, 0]));
    expect(await run()).toEqual(want.map((v, k) => v + 900 * (k % n))); // found again, the same buffers bound
    expect(gpu.bindGroupCount - g0).toBe(n * n);
    for (const buf of [...src, ...dst, out]) gpu.releaseBuffer(buf);
  });

  it('splits more than 65535 workgroups over an x/y grid', async () => {
    expect(splitGrid(100, 65535)).toEqual([100, 1, 1]);
    expect(splitGrid(70000, 65535)).toEqual([35000, 2, 1]);
    expect(splitGrid(151936, 65535)).toEqual([50646, 3, 1]);
    expect(() => splitGrid(65536 * 65536, 65535)).toThrow();
    const n = 70001;
    const ids = gpu.createBuffer(n * 4, 'ids');
    gpu.dispatch(gpu.kernel('test', 'write_ids'), [ids], n);
    const got = await gpu.readU32(ids, n);
    let bad = 0;
    for (let i = 0; i < n; i++) if (got[i] !== i + 1) bad++;
    expect(bad).toBe(0);
  });

  it('caches pipelines by (shader, entry, defines, constants) and records the variant on the kernel', () => {
    expect(gpu.kernel('test', 'set_one')).toBe(gpu.kernel('test', 'set_one'));
    const k64 = gpu.kernel('rmsnorm', 'rmsnorm_forward', {}, { WG: 64 });
    expect(k64).toBe(gpu.kernel('rmsnorm', 'rmsnorm_forward', {}, { WG: 64 }));
    expect(k64).not.toBe(gpu.kernel('rmsnorm', 'rmsnorm_forward', {}, { WG: 256 }));
    const q4 = gpu.kernel('matmul', 'matmul_rows', { WEIGHTS: 'q4', TMAX: 2 });
    expect(q4).not.toBe(gpu.kernel('matmul', 'matmul_rows', { WEIGHTS: 'bf16', TMAX: 2 }));
    expect(q4.defines).toEqual({ WEIGHTS: 'q4', TMAX: 2 });
    expect(k64.constants).toEqual({ WG: 64 });
    expect(() => gpu.kernel('matmul', 'matmul_rows', { TMAX: 2 })).toThrow(/'WEIGHTS' is not defined/);
  });
});

describe('errors', () => {
  it('a dispatch with a missing binding surfaces as GpuValidationError on read; the Gpu stays usable', async () => {
    const gate = gpu.createBuffer(16, 'gate');
    const out = gpu.createBuffer(16, 'out');
    gpu.write(gate, Float32Array.from([1, 2, 3, 4]));
    // siluMul needs (out, gate, up): leave out `up`.
    gpu.dispatch(gpu.kernel('elementwise', 'silu_mul_forward'), [out, gate], 1, [4]);
    const err = await gpu.readF32(out).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GpuValidationError);
    expect(err).toBeInstanceOf(GpuError);
    expect((err as Error).name).toBe('GpuValidationError');
    // Recovered: the next correct call works and throws nothing.
    K.siluMul(gpu, out, gate, gpu.createBuffer(16, 'up'), 4);
    await expect(gpu.readF32(out)).resolves.toHaveLength(4);
  });

  it('a dispatch without the params its shader reads is a GpuValidationError', async () => {
    const out = gpu.createBuffer(16, 'out');
    // set_one reads a uniform struct; a dispatch without params leaves binding 0 unbound.
    gpu.dispatch(gpu.kernel('test', 'set_one'), [out], 1);
    await expect(gpu.sync()).rejects.toBeInstanceOf(GpuValidationError);
  });

  it('an uncaptured error (raw device call outside our scopes) is thrown from the next read', async () => {
    gpu.device.createBuffer({ size: 4, usage: 0, label: 'bad-usage' });
    const b = gpu.createBuffer(16, 'b');
    await expect(gpu.readF32(b)).rejects.toBeInstanceOf(GpuValidationError);
    await expect(gpu.readF32(b)).resolves.toHaveLength(4);
  });

  it('a WGSL compile error or a missing entry point is a GpuValidationError from sync()', async () => {
    gpu.kernel('broken', 'main');
    const err = await gpu.sync().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GpuValidationError);
    expect((err as Error).message).toMatch(/broken\.main/);
    gpu.kernel('test', 'no_such_entry');
    await expect(gpu.sync()).rejects.toBeInstanceOf(GpuValidationError);
  });

  it('allocations beyond maxBufferSize throw GpuOutOfMemoryError', () => {
    expect(() => gpu.createBuffer(gpu.limits.maxBufferSize + 4, 'huge')).toThrow(GpuOutOfMemoryError);
  });

  it('after destroy(), calls throw GpuDeviceLostError', async () => {
    gpu.destroy();
    expect(() => gpu.createBuffer(4, 'x')).toThrow(GpuDeviceLostError);
    expect(() => gpu.flush()).toThrow(GpuDeviceLostError);
  });
});

describe('buffer pool trimming', () => {
  it('keeps at most poolFreeBytes of released buffers after a submit, destroying the oldest', async () => {
    const g = await createGpu();
    try {
      g.poolFreeBytes = 12288;
      const x = g.createBuffer(16, 'x'); // before the releases: a new size would drop the free buffers
      const bufs = [1024, 2048, 4096, 8192].map((n, i) => g.createBuffer(n, `b${i}`));
      for (const b of bufs) g.releaseBuffer(b);
      expect(g.memory.freeBytes).toBe(1024 + 2048 + 4096 + 8192);
      g.write(x, new Uint32Array([1, 2, 3, 4]));
      g.clear(x); // something to submit
      await g.sync();
      expect(g.memory.freeBytes).toBe(4096 + 8192); // the two oldest (1024, 2048) were destroyed
      // A survivor is reused.
      const again = g.createBuffer(8192, 'again');
      expect(again).toBe(bufs[3]);
      expect(Array.from(await g.readU32(x))).toEqual([0, 0, 0, 0]);
    } finally {
      g.destroy();
    }
  });
});

describe('memory accounting', () => {
  it('counts every buffer the Gpu holds (in use, pooled free, staging, uniforms) and its peak', async () => {
    const g = await createGpu();
    try {
      const m0 = g.memory;
      expect(m0.liveBytes).toBe(0);
      const a = g.createBuffer(1000, 'a'); // rounded up to 1000 (a multiple of 4)
      const b = g.createBuffer(4098, 'b'); // rounded up to 4100
      expect(g.memory).toMatchObject({ liveBytes: 5100, peakBytes: 5100, inUseBytes: 5100, freeBytes: 0 });
      g.releaseBuffer(b); // held free in the pool: still allocated
      expect(g.memory).toMatchObject({ liveBytes: 5100, inUseBytes: 1000, freeBytes: 4100 });
      expect(g.createBuffer(4098, 'b again')).toBe(b); // a hit allocates nothing
      expect(g.memory.peakBytes).toBe(5100);
      g.releaseBuffer(b);
      // A new size that does not fit under the peak drops free buffers (oldest first) before it
      // is made: the peak is the live set 1000 + 8000, not 5100 + 8000 with b still pooled.
      const c = g.createBuffer(8000, 'c');
      expect(g.memory).toMatchObject({ liveBytes: 9000, peakBytes: 9000, freeBytes: 0 });
      g.releaseBuffer(c);
      expect(g.createBuffer(8000, 'c again')).toBe(c);
      g.memory.resetPeak();
      expect(g.memory.peakBytes).toBe(9000);
      // A dispatch with params allocates one 64 KiB uniform chunk; a read allocates a 1000-byte staging buffer.
      K.siluMul(g, a, c, g.createBuffer(1000, 'up'), 250);
      const back = await g.readF32(a);
      expect(back).toHaveLength(250);
      const m = g.memory;
      expect(m.uniformBytes).toBe(64 * 1024);
      expect(m.stagingBytes).toBe(1000);
      expect(m.liveBytes).toBe(1000 + 8000 + 1000 + 64 * 1024 + 1000);
      expect(m.peakBytes).toBe(m.liveBytes);
      g.releaseBuffer(c);
      g.releaseBuffer(a);
      // A miss destroys the oldest free buffers until the new one fits under the peak: c (8000)
      // goes, a (1000, released after it) stays for reuse, and the peak does not move.
      const peak = g.memory.peakBytes;
      g.releaseBuffer(g.createBuffer(12, 'tiny'));
      expect(g.memory).toMatchObject({
        liveBytes: 1000 + 1000 + 12 + 64 * 1024 + 1000,
        freeBytes: 1012,
        inUseBytes: 1000,
      });
      expect(g.memory.peakBytes).toBe(peak);
      expect(g.createBuffer(1000, 'a again')).toBe(a);
      // Under the peak with room to spare, a new size keeps every free buffer (tiny).
      const d = g.createBuffer(4000, 'd');
      expect(g.memory).toMatchObject({ freeBytes: 12, inUseBytes: 1000 + 1000 + 4000, peakBytes: peak });
      g.releaseBuffer(d);
    } finally {
      g.destroy();
    }
    expect(g.memory.liveBytes).toBe(0);
  });

  it('bounds the uniform arena at MAX_PARAM_DISPATCHES_PER_SUBMIT slots however many dispatches a batch has, each with its own params', async () => {
    const g = await createGpu({ shaderSource: (name) => (name === 'test' ? TEST_WGSL : shaderSource(name)) });
    try {
      const n = 2 * MAX_PARAM_DISPATCHES_PER_SUBMIT + 100; // three submits
      const out = g.createBuffer(n * 4, 'out');
      const set = g.kernel('test', 'set_one');
      const submits = g.submitCount;
      for (let i = 0; i < n; i++) g.dispatch(set, [out], 1, [i, f32(i * 0.25)]);
      const got = await g.readF32(out);
      expect(Array.from(got)).toEqual(Array.from({ length: n }, (_, i) => i * 0.25));
      expect(g.submitCount - submits).toBe(3);
      expect(MAX_PARAM_DISPATCHES_PER_SUBMIT * 256).toBe(UNIFORM_ARENA_BYTES);
      expect(g.memory.uniformBytes).toBe(UNIFORM_ARENA_BYTES);
    } finally {
      g.destroy();
    }
  });

  it('stages small writes in the command stream: ordered with the dispatches around them, no submit, one upload chunk', async () => {
    const g = await createGpu({ shaderSource: (name) => (name === 'test' ? TEST_WGSL : shaderSource(name)) });
    try {
      const n = 64;
      const a = g.createBuffer(n * 4, 'a');
      const b = g.createBuffer(n * 4, 'b');
      const set = g.kernel('test', 'set_one');
      const submits = g.submitCount;
      // dispatch, write over it, dispatch again, copy: each step must see the one before.
      g.dispatch(set, [a], 1, [0, f32(7)]);
      g.write(a, new Float32Array(n).fill(1)); // overwrites a[0] = 7
      g.dispatch(set, [a], 1, [1, f32(9)]);
      g.copy(a, 0, b, 0, n * 4);
      g.write(a, new Float32Array([5]), 8); // a[2] = 5 after the copy: b keeps 1
      expect(g.submitCount).toBe(submits); // nothing submitted yet
      const want = Array.from({ length: n }, (_, i) => (i === 1 ? 9 : i === 2 ? 5 : 1));
      expect(Array.from(await g.readF32(a))).toEqual(want);
      expect(Array.from(await g.readF32(b))).toEqual(want.map((v, i) => (i === 2 ? 1 : v)));
      // Many small writes in one batch: the arena stays one chunk (a submit makes room).
      const big = g.createBuffer(16 * 1024, 'big');
      for (let i = 0; i < 40; i++) g.write(big, new Float32Array(4096).fill(i)); // 40 x 16 KiB > one 256 KiB chunk
      expect(Array.from((await g.readF32(big)).slice(0, 2))).toEqual([39, 39]);
      expect(g.memory.uniformBytes).toBe(64 * 1024 + 256 * 1024); // one params chunk, one upload chunk
    } finally {
      g.destroy();
    }
  });
});
