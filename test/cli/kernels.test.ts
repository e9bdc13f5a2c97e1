// --kernels NAME=VALUE,...: the CLI's override of the kernel variants' automatic choices
// (src/ops/common.ts tuning, parseTuning). The parser's errors name the part, switch or value;
// a real `spyrl logits` run with overrides still matches the PyTorch logits, and forcing the f16
// GEMM on a GPU without shader-f16 is refused up front.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { engineOptions, UsageError } from '../../src/cli/args.ts';
import { createGpu } from '../../src/gpu/index.ts';
import { parseTuning, TUNING_CHOICES, tuning } from '../../src/ops/common.ts';
import { spyrl } from '../helpers/spyrl.ts';

describe('parseTuning', () => {
  it('takes name=value pairs of the known switches', () => {
    expect(parseTuning('gemmF16=off, attentionBackward=row')).toEqual({ gemmF16: 'off', attentionBackward: 'row' });
    expect(parseTuning('matmul=tiled,')).toEqual({ matmul: 'tiled' });
    expect(parseTuning('')).toEqual({});
  });

  it('names what is wrong', () => {
    expect(() => parseTuning('gemmF16')).toThrow(/"gemmF16" is not name=value/);
    expect(() => parseTuning('gemm=off')).toThrow(/no kernel switch "gemm": one of matmul, attention/);
    expect(() => parseTuning('gemmF16=yes')).toThrow(/gemmF16 must be one of auto, on, off \(got "yes"\)/);
    expect(() => parseTuning('matmul=tiled,matmul=rows')).toThrow(/matmul is given twice/);
    expect(() => parseTuning('toString=x')).toThrow(/no kernel switch "toString"/);
  });

  it('every switch is listed, with its current default first, and in the help text', async () => {
    expect(Object.keys(TUNING_CHOICES).sort()).toEqual(Object.keys(tuning).sort());
    for (const [name, choices] of Object.entries(TUNING_CHOICES)) {
      expect(choices[0], name).toBe(tuning[name as keyof typeof tuning]);
    }
    const help = (await spyrl('--help')).stdout.replace(/\s+/g, ' ');
    for (const [name, choices] of Object.entries(TUNING_CHOICES))
      expect(help).toContain(`${name} ${choices.join('|')}`);
  });

  it('--kernels errors are usage errors naming the flag', () => {
    expect(engineOptions({ kernels: 'gemmF16=off' })).toEqual({
      weights: 'bf16',
      kv: 'f32',
      kernels: { gemmF16: 'off' },
    });
    expect(() => engineOptions({ kernels: 'attention=fast' })).toThrow(UsageError);
    expect(() => engineOptions({ kernels: 'attention=fast' })).toThrow(/^--kernels: attention must be one of/);
  });
});

describe('spyrl --kernels', () => {
  const dir = join(import.meta.dirname, '../fixtures/golden/tied');
  let tmp: string;
  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'spyrl-kernels-'));
  });
  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  it('logits with the tiled GEMM and the per-(token, head) attention forced match PyTorch', async () => {
    const exp = JSON.parse(await readFile(join(dir, 'expected.json'), 'utf8')) as {
      tokens: number[];
      max_abs_logit: number;
    };
    const out = join(tmp, 'logits.f32');
    const args = ['--model', dir, '--tokens', exp.tokens.join(','), '--out', out];
    const r = await spyrl('logits', ...args, '--kernels', 'matmul=tiled,attention=single,gemmF16=off');
    expect(r.code, r.stderr).toBe(0);
    const got = new Float32Array((await readFile(out)).buffer.slice(0));
    const ref = new Float32Array((await readFile(join(dir, 'logits.f32'))).buffer.slice(0));
    let err = 0;
    for (let i = 0; i < ref.length; i++) err = Math.max(err, Math.abs(got[i]! - ref[i]!));
    expect(err).toBeLessThanOrEqual(1e-3 * exp.max_abs_logit);

    const bad = await spyrl('logits', ...args, '--kernels', 'matmul=fast');
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(
      /--kernels: matmul must be one of auto, rows, blocks, lanes, gemv, tiled \(got "fast"\)/,
    );
  });

  it('gemmF16=on is refused up front where the GPU has no shader-f16', async () => {
    const gpu = await createGpu();
    const hasF16 = gpu.features.f16;
    gpu.destroy();
    const exp = JSON.parse(await readFile(join(dir, 'expected.json'), 'utf8')) as {
      tokens: number[];
      max_abs_logit: number;
    };
    const r = await spyrl(
      'logits',
      '--model',
      dir,
      '--tokens',
      exp.tokens.join(','),
      '--out',
      join(tmp, 'f16.f32'),
      '--kernels',
      'gemmF16=on',
    );
    if (hasF16) {
      // Forced where it would not be 'auto' (a CPU adapter): the f16 GEMM's budget (golden.test.ts).
      expect(r.code, r.stderr).toBe(0);
      const got = new Float32Array((await readFile(join(tmp, 'f16.f32'))).buffer.slice(0));
      const ref = new Float32Array((await readFile(join(dir, 'logits.f32'))).buffer.slice(0));
      let err = 0;
      for (let i = 0; i < ref.length; i++) err = Math.max(err, Math.abs(got[i]! - ref[i]!));
      expect(err).toBeLessThanOrEqual(5e-3 * exp.max_abs_logit);
    } else {
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(/--kernels: gemmF16=on needs shader-f16, which this GPU \(.*\) lacks/);
    }
  });
});
