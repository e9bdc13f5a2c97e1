// bench/gpu-check.ts, the device run's first step (the model against PyTorch on a real GPU with
// its own 'auto' kernels): here on this adapter, its checks pass (one of each fixture kind), a check that throws
// is reported as a failed line (and the rest still run), and its error measure catches NaNs.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { gpuCheck, relErr } from '../../bench/gpu-check.ts';
import { createGpu, type Gpu } from '../../src/gpu/index.ts';

let gpu: Gpu;
beforeAll(async () => {
  gpu = await createGpu();
});
afterAll(() => gpu?.destroy());

describe('gpu-check', () => {
  it('passes on the fixtures: golden, LoRA, q4; matmul and attention at 4B shapes', async () => {
    const log: string[] = [];
    const lines = await gpuCheck(gpu, (l) => log.push(l), { golden: ['tied'], lora: ['untied-rslora'], q4: ['mha'] });
    expect(log.join('\n')).not.toContain('FAIL');
    expect(lines.map((l) => l.name)).toEqual([
      'golden tied: logits, 16-token prefill',
      'golden tied: 16 greedy tokens',
      'LoRA untied-rslora: logits',
      'LoRA untied-rslora: loss',
      'LoRA untied-rslora: every LoRA gradient',
      'q4 mha: logits',
      ...[
        [9728, 2560],
        [2560, 9728],
      ].flatMap(([N, Kd]) =>
        ['bf16', 'q4'].flatMap((f) =>
          [1, 4, 32].map((M) =>
            expect.stringMatching(new RegExp(`^matmul ${f} M=${M} N=${N} K=${Kd} \\(.*WEIGHTS=${f}`)),
          ),
        ),
      ),
      expect.stringMatching(/^attention causal T=256 32\/8x128: forward and lse \(attention\.attention_tiled_lse/),
      'attention causal T=256 32/8x128: dq, dk, dv',
      expect.stringMatching(/^attention packed tree T=256 32\/8x128: forward and lse \(.*TREE=1/),
      'attention packed tree T=256 32/8x128: dq, dk, dv',
    ]);
    for (const l of lines) expect(l.error, l.name).toBeLessThanOrEqual(l.budget);
  }, 300_000);

  it('a check that throws is a failed line, and the next check still runs', async () => {
    const log: string[] = [];
    const lines = await gpuCheck(gpu, (l) => log.push(l), {
      golden: ['no-such-variant', 'tied'],
      lora: [],
      q4: [],
      matmul: false,
      attention: false,
    });
    expect(lines[0]).toMatchObject({ name: 'golden no-such-variant', ok: false });
    expect(log[0]).toMatch(/^FAIL golden no-such-variant: threw: .*no-such-variant/);
    expect(lines.slice(1).every((l) => l.ok)).toBe(true);
    expect(lines).toHaveLength(3);
  });

  it('relErr: max |a - b| / scale; NaN or a length mismatch is Infinity', () => {
    expect(relErr([1, 2, 3], [1, 2.5, 3], 5)).toBeCloseTo(0.1);
    expect(relErr([1, Number.NaN], [1, 2], 1)).toBe(Infinity);
    expect(relErr([Number.NaN, 1], [1, 1], 1)).toBe(Infinity);
    expect(relErr([1], [1, 2], 1)).toBe(Infinity);
  });
});
