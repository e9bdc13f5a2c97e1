// bench/device-report.ts: issue 12's targets judged from a device run's files. Each target's
// verdict follows its rule (decode's share of the copy bandwidth, PEFT / ours for the LoRA step,
// the round's 36-layer bounds), a missing or malformed file makes its rows say so, and
// gpu-check's failures are listed.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  deviceReport,
  lastJsonObject,
  parseAttentionAb,
  parseChunkAb,
  parseGemvSweep,
  parseProfiles,
  readDeviceRun,
  type PeftStep,
} from '../../bench/device-report.ts';
import { makeRecord, type BenchRecord, type BenchReport } from '../../bench/measure.ts';

const roof = { copyGBs: 4000, fmaGFLOPs: 60_000 };
const rec = (name: string, shape: string, seconds: number, bytes = 0, tokens?: number): BenchRecord =>
  makeRecord({ group: 'e2e', name, shape, flops: 1, bytes, seconds, reps: 3, tokens }, roof);
const report = (records: BenchRecord[]): BenchReport => ({
  adapter: 'nvidia h200',
  architecture: 'hopper',
  features: [],
  mode: 'full',
  runtime: 'node v20 (Dawn)',
  date: '2026-12-04',
  roofline: roof,
  records,
});
const peft = (tokPerS: number): PeftStep => ({
  engine: 'PyTorch + PEFT (eager)',
  device: 'NVIDIA H200',
  model: '4b',
  layers: 4,
  tokens: 512,
  r: 16,
  dtype: 'bf16',
  tok_per_s: tokPerS,
  median_s: 512 / tokPerS,
});
const roundReport = (seconds: number) =>
  report([
    rec('round: votes', '4b q4 kv=f16 L=4 players=4', 1),
    rec('round: round total (play + update)', '4b q4 kv=f16 L=4 players=4', seconds),
  ]);
const rowOf = (lines: string[], start: string) => lines.find((l) => l.startsWith(`| ${start}`));

describe('device-report', () => {
  it('judges each target by its rule', () => {
    // Decode: 3 GB read in 1 ms is 3,000 GB/s = 75% of the 4,000 GB/s copy; the B=4 row is for reference.
    const bench = report([
      rec('4b decode B=1 @ctx 128 (LoRA)', '4b q4 kv=f16 L=4', 1e-3, 3e9),
      rec('4b decode B=4 @ctx 128 (LoRA)', '4b q4 kv=f16 L=4', 2e-3, 3e9),
      rec('4b decode B=1 @ctx 128 (LoRA)', '4b bf16 kv=f16 L=4', 1e-3, 1e9), // bf16: not this target's
      rec('4b LoRA step 512 tok r=16', '4b q4 kv=f16 L=4', 0.25, 1, 512), // q4: not PEFT's bf16
      rec('4b LoRA step 512 tok r=16', '4b bf16 kv=f16 L=4', 0.5, 1, 512), // 1,024 tok/s
    ]);
    const lines = deviceReport({
      bench,
      round: roundReport(1.5),
      peft: peft(2048),
      summary: 'gpu-check: all 19 checks passed\n',
    });
    expect(lines[0]).toBe(
      'Machine: nvidia h200 (hopper), node v20 (Dawn), 2026-12-04; measured roofline: copy 4,000.0 GB/s, FMA 60,000.0 GFLOP/s',
    );
    expect(lines[1]).toBe('Kernels against PyTorch on this GPU (bench/gpu-check.ts): all 19 checks passed');
    expect(rowOf(lines, 'decode B=1')).toBe(
      '| decode B=1 @ctx 128 (LoRA), 4B q4 (L=4 of 36) | 1.00 ms/step, 3,000 GB/s = 75.0% of copy | >= 70.0% of copy | yes |',
    );
    expect(rowOf(lines, 'decode B=4')).toMatch(
      /\(for reference\) \| 2\.00 ms\/step, 1,500 GB\/s = 37\.5% of copy \| {2}\| {2}\|$/,
    );
    expect(lines.filter((l) => l.includes('decode'))).toHaveLength(2);
    expect(rowOf(lines, 'LoRA step')).toMatch(
      /ours 1,020 tok\/s .* 2,050 tok\/s: PEFT \/ ours = 2\.00x \| PEFT \/ ours <= 3x \| yes \|$/,
    );
    // 1.5 s with 4 layers: at most 13.5 s with 36.
    expect(rowOf(lines, 'default SpyRL round')).toMatch(
      /1\.5 s with 4 layers; 36 layers: at most 13\.5 s \(x 36\/4\) \| < 60 s at 36 layers \| yes \|$/,
    );
    // The step with every layer kept (no recompute, as PEFT eager) is compared when it is the faster.
    const kept = report([
      ...bench.records,
      rec('4b LoRA step 512 tok r=16, every layer kept', '4b bf16 kv=f16 L=4', 0.4, 1, 512), // 1,280 tok/s
    ]);
    expect(rowOf(deviceReport({ bench: kept, peft: peft(2048) }), 'LoRA step')).toMatch(
      /ours 1,280 tok\/s \(400\.0 ms, every layer kept\), .*PEFT \/ ours = 1\.60x \| PEFT \/ ours <= 3x \| yes \|$/,
    );
    expect(lines).toContain('- round: votes: 1.00 s');

    const slow = report([rec('4b decode B=1 @ctx 128 (LoRA)', '4b q4 kv=f16 L=4', 1e-3, 2e9), bench.records[4]!]);
    const worse = deviceReport({ bench: slow, round: roundReport(10), peft: peft(4096) });
    expect(rowOf(worse, 'decode B=1')).toMatch(/50\.0% of copy \| >= 70\.0% of copy \| no \|$/);
    // With the generate loop's record too, the target is judged on it, the waited step for reference.
    const both = deviceReport({
      bench: report([
        rec('4b decode B=1 @ctx 128 (LoRA)', '4b q4 kv=f16 L=4', 1e-3, 2e9),
        rec('4b decode B=1 @ctx 128 (LoRA, generate loop)', '4b q4 kv=f16 L=4', 1e-3, 3e9),
      ]),
    });
    expect(rowOf(both, 'decode B=1 @ctx 128 (LoRA),')).toMatch(/\(for reference\) \| .*50\.0% of copy \| {2}\| {2}\|$/);
    expect(rowOf(both, 'decode B=1 @ctx 128 (LoRA, generate loop)')).toMatch(
      /75\.0% of copy \| >= 70\.0% of copy \| yes \|$/,
    );
    // A run at 4 and at all 36 layers: judged at 36, the 4-layer record for reference; the round
    // played with all 36 layers is judged on its own time.
    const deep = deviceReport({
      bench: report([
        rec('4b decode B=1 @ctx 128 (LoRA, generate loop)', '4b q4 kv=f16 L=4', 1e-3, 3e9),
        rec('4b decode B=1 @ctx 128 (LoRA, generate loop)', '4b q4 kv=f16 L=36', 10e-3, 2e10),
      ]),
      round: report([
        rec('round: round total (play + update)', '4b q4 kv=f16 L=36 players=4', 42),
        rec('round: votes', '4b q4 kv=f16 L=36 players=4', 7),
      ]),
    });
    expect(deep.find((l) => l.includes('(L=4 of 36)'))).toMatch(
      /\(for reference\) \| .*75\.0% of copy \| {2}\| {2}\|$/,
    );
    expect(deep.find((l) => l.includes('(L=36 of 36)'))).toMatch(/50\.0% of copy \| >= 70\.0% of copy \| no \|$/);
    expect(rowOf(deep, 'default SpyRL round')).toMatch(
      /\| 42\.0 s with all 36 layers \| < 60 s at 36 layers \| yes \|$/,
    );
    expect(deep).toContain('- round: votes: 7.00 s');
    expect(rowOf(worse, 'LoRA step')).toMatch(/PEFT \/ ours = 4\.00x \| PEFT \/ ours <= 3x \| no \|$/);
    expect(rowOf(worse, 'default SpyRL round')).toMatch(/at most 90\.0 s .* \| open \(between the bounds\) \|$/);
    expect(rowOf(deviceReport({ round: roundReport(61) }), 'default SpyRL round')).toMatch(/\| no \|$/);
  });

  it('says what is missing instead of a verdict, and lists gpu-check failures', () => {
    const lines = deviceReport({
      bench: 'missing',
      round: 'not readable (Unexpected end of JSON input)',
      peft: peft(1000),
      summary: 'FAIL LoRA tied-all: every LoRA gradient: 3.1e-2\ngpu-check: 1 of 19 checks FAILED\n',
    });
    expect(lines[0]).toBe('Machine: unknown (bench.json: missing)');
    expect(lines[1]).toBe(
      'Kernels against PyTorch on this GPU (bench/gpu-check.ts): 1 of 19 checks FAILED: LoRA tied-all: every LoRA gradient: 3.1e-2',
    );
    expect(rowOf(lines, 'decode, Qwen3-4B q4')).toBe(
      '| decode, Qwen3-4B q4 | bench.json: missing | >= 70.0% of copy | not measured |',
    );
    expect(rowOf(lines, 'LoRA step')).toMatch(/\| bench\.json: missing \| .* \| not measured \|$/);
    expect(rowOf(lines, 'default SpyRL round')).toMatch(
      /round\.json: not readable \(Unexpected end of JSON input\) .* not measured \|$/,
    );
    // A LoRA step at other tokens than PEFT's is not compared.
    const other = report([rec('4b LoRA step 256 tok r=16', '4b q4 kv=f16 L=4', 0.5, 1, 256)]);
    expect(rowOf(deviceReport({ bench: other, peft: peft(1000) }), 'LoRA step')).toMatch(
      /no "4b LoRA step 512 tok" record at L=4/,
    );
    expect(deviceReport({ summary: 'bench (limit 195s)\n' })[1]).toMatch(/no verdict in summary\.log/);
  });

  it('reads a run folder: the peft JSON after its warnings, missing and malformed files named', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'spyrl-device-'));
    try {
      await writeFile(
        join(dir, 'peft.log'),
        `Loading weights: 100%\nwarning: {not json}\n${JSON.stringify(peft(900), null, 1)}\n`,
      );
      await writeFile(join(dir, 'bench.json'), '{"records": "no"}');
      await writeFile(join(dir, 'summary.log'), 'gpu-check: all 19 checks passed\n');
      const run = await readDeviceRun(dir);
      expect((run.peft as PeftStep).tok_per_s).toBe(900);
      expect(run.bench).toBe('not readable (no records)');
      expect(run.round).toBe('missing');
      expect(run.summary).toContain('all 19');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    expect(() => lastJsonObject('no json here')).toThrow(/no JSON object/);
  });
});

describe('the H200 run of 2026-12-04 (bench/results/2026-12-04-h200)', () => {
  it('reads the real files: gpu-check passed, and each target carries its measured number', async () => {
    const lines = deviceReport(await readDeviceRun('bench/results/2026-12-04-h200'));
    const text = lines.join('\n');
    expect(text).toContain('all 31 checks passed');
    expect(text).toMatch(/decode B=1 @ctx 128 \(LoRA\), 4B q4.*23\.94 ms\/step.*\| no \|/);
    expect(text).toMatch(/PEFT \/ ours = 9\.47x.*\| no \|/);
    expect(text).toMatch(/9\.4 s with 4 layers; 36 layers: at most 84\.4 s.*open/);
    expect(text).not.toContain('not measured');
    // attention-ab.log: the ratios over tiled:split, and the fastest per T and op.
    expect(text).toContain('| T | op | single | tiled:row | fastest |');
    expect(text).toContain('| 512 | bwd (train) | 0.60 | 1.53 | single |');
    expect(text).toContain('| 2048 | bwd (train) | 1.84 | 1.75 | tiled:split |');
  });
});

describe('attention-ab.log', () => {
  const log = [
    'google: maxComputeWorkgroupStorageSize 49152',
    'shader-ab: T=64 old / new = 1.00', // another script's line
    'T=512 attention fwd (train): tiled:row / tiled:blocks = 1.80 (medians), 1.70 (minima); tiled:row 0.003 s',
    'T=512 attention fwd (train): tiled:blocks2 / tiled:blocks = 1.00 (medians), 1.00 (minima); x',
    'T=512 attention bwd (train): tiled:row / tiled:blocks = 0.90 (medians), 0.95 (minima); x',
    'T=512 attention bwd (train): tiled:blocks2 / tiled:blocks = 0.80 (medians), 0.85 (minima); x',
    'T=512 fwd [tiled:blocks]: tree / causal = 0.84 (minima); visible pairs ~0.82 of the causal',
  ].join('\n');

  it('gives each variant its ratio and each (T, op) its fastest variant', () => {
    const ab = parseAttentionAb(log);
    expect(ab.base).toBe('tiled:blocks');
    expect(ab.rows.map((r) => [r.T, r.op, Object.fromEntries(r.ratios)])).toEqual([
      [512, 'attention fwd (train)', { 'tiled:row': 1.8, 'tiled:blocks2': 1 }],
      [512, 'attention bwd (train)', { 'tiled:row': 0.9, 'tiled:blocks2': 0.8 }],
    ]);
    const text = deviceReport({ attention: ab }).join('\n');
    expect(text).toContain("median time over tiled:blocks's");
    expect(text).toContain('| 512 | fwd (train) | 1.80 | 1.00 | tiled:blocks |');
    expect(text).toContain('| 512 | bwd (train) | 0.90 | 0.80 | tiled:blocks2 |');
    expect(text).toContain('- T=512 fwd [tiled:blocks]: tree / causal = 0.84');
  });

  it('says so where the log has no ratio line or is missing', async () => {
    expect(() => parseAttentionAb('attention-ab: exit 124\n')).toThrow(/no "T=\.\.\. attention/);
    const dir = await mkdtemp(join(tmpdir(), 'spyrl-device-'));
    try {
      expect((await readDeviceRun(dir)).attention).toBe('missing');
      await writeFile(join(dir, 'attention-ab.log'), 'killed\n');
      const run = await readDeviceRun(dir);
      expect(deviceReport(run).join('\n')).toMatch(/Attention side by side: attention-ab\.log: not readable \(no "T=/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('bench/profile.ts runs side by side (round.log, gemv-ab.log)', () => {
  const head = (kernels?: string) =>
    `# nvidia h100; 4b with 4 of 36 layers, q4 weights, f16 KV, LoRA r 16 on all projections${kernels ? `; kernels ${kernels}` : ''}`;
  const unit = (name: string, gpu: number) =>
    `## ${name}: GPU ${gpu} ms in 65 dispatches per unit; unprofiled wall ${gpu + 1} ms per unit`;

  it('reads each run and its units, and sets each unit beside the first run', () => {
    const log = [
      '# spyrl bench on nvidia h100 (node; full shapes)', // the round's header: not a profile
      unit('round stray', 1), // a unit line before any profile header: skipped
      head(),
      unit('decode B=4 @ctx 2048 (4 steps)', 4),
      'kernel  calls  ms',
      unit('LoRA training step, 512 tokens', 120),
      head('gemvLanes=4'),
      unit('decode B=4 @ctx 2048 (4 steps)', 3),
      unit('LoRA training step, 512 tokens', 180),
      head('gemvLanes=16'), // no units (cut off at the limit): left out
    ].join('\n');
    const runs = parseProfiles(log);
    expect(runs.map((r) => [r.kernels, r.units.map((u) => [u.name, u.gpuMs, u.dispatches, u.wallMs])])).toEqual([
      [
        '',
        [
          ['decode B=4 @ctx 2048 (4 steps)', 4, 65, 5],
          ['LoRA training step, 512 tokens', 120, 65, 121],
        ],
      ],
      [
        'gemvLanes=4',
        [
          ['decode B=4 @ctx 2048 (4 steps)', 3, 65, 4],
          ['LoRA training step, 512 tokens', 180, 65, 181],
        ],
      ],
    ]);
    const text = deviceReport({ profiles: [{ file: 'gemv-ab.log', runs }] }).join('\n');
    expect(text).toContain("| unit | 'auto' | `gemvLanes=4` |");
    expect(text).toContain('| decode B=4 @ctx 2048 (4 steps) | 4.00 | 3.00 (0.75x) |');
    expect(text).toContain('| LoRA training step, 512 tokens | 120.00 | 180.00 (1.50x) |');
    // Runs of other shapes (attention-ab.log: B = 1 and 4, each with and without a switch): each
    // unit against the first run that has it, the others' cells empty.
    const shapes = parseProfiles(
      [
        head(),
        unit('decode B=1 @ctx 2048 (4 steps, round sampling)', 2),
        head('attention=split'),
        unit('decode B=1 @ctx 2048 (4 steps, round sampling)', 3),
        head(),
        unit('decode B=4 @ctx 2048 (4 steps, round sampling)', 4),
        head('attention=split'),
        unit('decode B=4 @ctx 2048 (4 steps, round sampling)', 6),
      ].join('\n'),
    );
    const shapesText = deviceReport({ profiles: [{ file: 'attention-ab.log', runs: shapes }] }).join('\n');
    expect(shapesText).toContain("| unit | 'auto' | `attention=split` | 'auto' | `attention=split` |");
    expect(shapesText).toContain('| decode B=1 @ctx 2048 (4 steps, round sampling) | 2.00 | 3.00 (1.50x) |  |  |');
    expect(shapesText).toContain('| decode B=4 @ctx 2048 (4 steps, round sampling) |  |  | 4.00 | 6.00 (1.50x) |');
    // One run alone: nothing side by side.
    expect(deviceReport({ profiles: [{ file: 'x.log', runs: runs.slice(0, 1) }] }).join('\n')).not.toContain(
      'Profiles',
    );
  });

  it("names the weights where the runs' differ, and sets each run beside the first with its weights", () => {
    const headW = (weights: string, kernels?: string) => head(kernels).replace('q4 weights', `${weights} weights`);
    const runs = parseProfiles(
      [
        headW('q4'),
        unit('LoRA training step, 512 tokens', 100),
        headW('bf16'),
        unit('LoRA training step, 512 tokens', 120),
        headW('q4', 'gemmTile=128'),
        unit('LoRA training step, 512 tokens', 80),
        headW('bf16', 'gemmTile=128'),
        unit('LoRA training step, 512 tokens', 90),
      ].join('\n'),
    );
    expect(runs.map((r) => [r.kernels, r.weights])).toEqual([
      ['', 'q4'],
      ['', 'bf16'],
      ['gemmTile=128', 'q4'],
      ['gemmTile=128', 'bf16'],
    ]);
    const text = deviceReport({ profiles: [{ file: 'round.log', runs }] }).join('\n');
    expect(text).toContain("| unit | 'auto' q4 | 'auto' bf16 | `gemmTile=128` q4 | `gemmTile=128` bf16 |");
    expect(text).toContain('| LoRA training step, 512 tokens | 100.00 | 120.00 | 80.00 (0.80x) | 90.00 (0.75x) |');
  });

  it('the H100 run of 2026-12-06 (bench/results/2026-12-06-h100-b): the attention before and after', async () => {
    const text = deviceReport(await readDeviceRun('bench/results/2026-12-06-h100-b')).join('\n');
    expect(text).toContain('all 31 checks passed');
    expect(text).toContain("| unit | 'auto' | `attentionForward=rows,attentionBackward=split,attentionDkvRows=4` |");
    expect(text).toContain('| LoRA training step, 512 tokens | 119.20 | 168.89 (1.42x) |');
    expect(text).toMatch(/default SpyRL round.*19\.6 s with all 36 layers.*\| yes \|/);
  });

  it('the H100 run of 2026-12-06 (bench/results/2026-12-06-h100): each target at 36 layers', async () => {
    const text = deviceReport(await readDeviceRun('bench/results/2026-12-06-h100')).join('\n');
    expect(text).toMatch(
      /decode B=1 @ctx 128 \(LoRA, generate loop\), 4B q4 \(L=36 of 36\) \| 12\.68 ms\/step.*6\.6% of copy \| >= 70\.0% of copy \| no \|/,
    );
    expect(text).toMatch(/PEFT \/ ours = 8\.28x.*\| no \|/);
    expect(text).toMatch(/24\.8 s with all 36 layers.*\| yes \|/);
    expect(text).toContain("| unit | 'auto' | `gemmSplitK=off` | `gemmSplitK=on` |");
  });
});

describe('gemv-ab.log: bench/gemv-sweep.ts tables', () => {
  const log = [
    "nvidia H100; 4b q4, 4 layers' weights in turn; copy 2700 GB/s; subgroups true",
    '',
    '## qkv B=1 (7.9 MiB of weights a call)',
    'lanes cols    us/call    GB/s  %copy  kernel',
    'auto  1          20.0     400   14.8%  gemv.gemv_lanes_group[COLS=32,GROUP=3,LANES=8,NORM=1]',
    "auto  4          10.0     800   29.6%  gemv.gemv_lanes_group[COLS=32,CPT=4,GROUP=3,LANES=32,NORM=1]  <- fastest  <- 'auto'",
    '16    1          12.5     640   23.7%  gemv.gemv_lanes_group[COLS=16,GROUP=3,LANES=16,NORM=1]',
    '',
    '## head B=4 (218.0 MiB of weights a call)',
    'lanes cols    us/call    GB/s  %copy  kernel',
    "auto  2         200.0    1090   40.4%  gemv.gemv_lanes[COLS=32,CPT=2,LANES=16]  <- 'auto'",
    '4     4         150.0    1453   53.8%  gemv.gemv_lanes[COLS=64,CPT=4,LANES=16]  <- fastest',
    'nvidia H100; M 512 N 9728 K 2560; q4 W', // the next script's output
    'matmul (x . W^T)                          4.23 ms   6027.86 GFLOP/s  WEIGHTS TILED VEC',
  ].join('\n');

  it("reads each table and sets the fastest layout beside 'auto''s", () => {
    const t = parseGemvSweep(log);
    expect(t.map((x) => [x.op, x.batch, x.rows.length])).toEqual([
      ['qkv', 1, 3],
      ['head', 4, 2],
    ]);
    expect(t[0]!.rows[1]).toMatchObject({ lanes: 'auto', cols: '4', us: 10, gbs: 800, auto: true });
    expect(t[0]!.rows[1]!.ofCopy).toBeCloseTo(0.296, 6);
    const text = deviceReport({ gemvSweep: t }).join('\n');
    expect(text).toContain('| qkv | 1 | auto / 4 | 10.0 | 800 | 29.6% | auto / 4 | 1.00 |');
    expect(text).toContain('| head | 4 | 4 / 4 | 150.0 | 1,450 | 53.8% | auto / 2 | 1.33 |');
  });

  it('says so where the log has no table', async () => {
    expect(() => parseGemvSweep('gemv-ab: exit 124\n')).toThrow(/no "## op B=T" table/);
    const text = deviceReport(await readDeviceRun('bench/results/2026-12-04-h200')).join('\n');
    expect(text).toMatch(/Decode GEMV layouts: gemv-ab\.log: (missing|not readable)/);
  });
});

describe('bench/chunk-ab.ts runs (round.log)', () => {
  it('reads each run, its title and each chunk, and reports them as tables', () => {
    const log = [
      '## SpyRL round: 4b (36 of 36 layers) q4', // the round's lines: skipped
      '# prefill of 2048 tokens on nvidia h100: 4b shapes, 4 layers, q4, f16 KV, LoRA r 16 on every projection',
      'round 1: 256-token chunks 30.1 ms, 1151 dispatches',
      'chunk  median ms  tok/s  dispatches  vs first',
      '  256       30.1  68040        1151  1.00x',
      ' 2048       20.5  99902         132  1.47x',
      '# LoRA training step (4 layers kept) of 2048 tokens by MLP chunk on nvidia h100: 4b shapes, 4 layers',
      'round 1: 256-row MLP chunks 700.0 ms, 2000 dispatches',
      'chunk  median ms  tok/s  dispatches  vs first',
      '  256      700.0   2926        2000  1.00x',
      ' 1024      610.5   3355         900  1.15x',
      '# nvidia h100; 4b with 4 of 36 layers, q4 weights', // a profile's header after it: the table ended
      '# prefill of 2048 tokens on nvidia h100: cut off before its table', // no table: left out
    ].join('\n');
    const runs = parseChunkAb(log);
    expect(
      runs.map((r) => [r.title.split(' on ')[0], r.rows.map((x) => [x.chunk, x.ms, x.dispatches, x.vsFirst])]),
    ).toEqual([
      [
        'prefill of 2048 tokens',
        [
          [256, 30.1, 1151, 1],
          [2048, 20.5, 132, 1.47],
        ],
      ],
      [
        'LoRA training step (4 layers kept) of 2048 tokens by MLP chunk',
        [
          [256, 700, 2000, 1],
          [1024, 610.5, 900, 1.15],
        ],
      ],
    ]);
    const lines = deviceReport({ chunks: runs });
    expect(
      lines.some((l) => l.startsWith('LoRA training step (4 layers kept)') && l.includes('bench/chunk-ab.ts')),
    ).toBe(true);
    expect(rowOf(lines, '1024')).toBe('| 1024 | 610.5 | 900 | 1.15x |');
    expect(parseChunkAb('no tables here')).toEqual([]);
  });
});
