// `npx tsx bench/device-report.ts DIR`: issue 12's GPU targets from a device run's files
// (scripts/device-run.sh writes them; the device tool brings them back to DIR), as the Markdown
// that goes into README: the machine, the kernels' correctness (gpu-check), then each target
// against the measurement it is judged by, from the numbers in the files and nothing else.
// - decode at Qwen3-4B q4 shapes: GB/s of a decode step (B=1, context 128, LoRA on) over the copy
//   kernel's, measured in the same run (bench.json); target >= 70%. Judged at the most layers the
//   run measured (all 36 where it ran them), on the generate loop's record (the rate at which
//   generate and the rollouts decode: each step encoded before the one before it is read) where
//   the run has one, else on the step waited for before the next; the other records are listed
//   for reference;
// - the LoRA step: PyTorch + PEFT's tokens/s (peft.log) over ours (bench.json "LoRA step"), same
//   shapes, layers and tokens; target <= 3x;
// - the default SpyRL round at 4B shapes (round.json): measured with L of 36 layers; every part of
//   a round grows at most linearly with the layers (the LM head, sampling and the CPU's share do
//   not grow at all), so t(L) x 36 / L bounds the 36-layer round from above and t(L) from below;
//   target < 60 s: met when the bound is under 60 s, missed when t(L) is over, open between.
// Then the attention kernels side by side (attention-ab.log): per T and op each variant's median
// time over the last variant's, and the fastest, which is what tuning's 'auto' should take; the
// decode GEMV's layouts swept (gemv-ab.log, bench/gemv-sweep.ts): per product and batch the
// fastest and 'auto''s; and
// bench/profile.ts's runs with other kernel switches beside the defaults' (round.log, gemv-ab.log):
// each unit's GPU time and its ratio to the first run's; and bench/chunk-ab.ts's tables in round.log
// (the prefill by prefill chunk, the LoRA step by MLP chunk): each chunk's median and its rate
// over the first chunk's.
// A file that is missing or malformed makes its rows say so; the rest still report.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { BenchReport } from './measure.ts';

/** scripts/bench_peft_step.py's JSON (the fields read here). */
export interface PeftStep {
  engine: string;
  device: string;
  model: string;
  layers: number;
  tokens: number;
  r: number;
  dtype: string;
  tok_per_s: number;
  median_s: number;
}

export interface DeviceRun {
  bench?: BenchReport | string; // the report, or why it is missing
  round?: BenchReport | string;
  peft?: PeftStep | string;
  /** summary.log's text (gpu-check's lines are in it), or why it is missing. */
  summary?: string;
  /** attention-ab.log's side-by-side lines, or why they are missing. */
  attention?: AttentionAb | string;
  /** bench/profile.ts's summaries in round.log and gemv-ab.log (each file's, or why not). */
  profiles?: { file: string; runs: ProfileRun[] | string }[];
  /** bench/gemv-sweep.ts's tables in gemv-ab.log, or why they are missing. */
  gemvSweep?: GemvSweep[] | string;
  /** bench/chunk-ab.ts's tables in round.log (none where it has none), or why the log is missing. */
  chunks?: ChunkAb[] | string;
}

/** One run of bench/chunk-ab.ts: its `# ...` title and each chunk's median. */
export interface ChunkAb {
  title: string;
  rows: { chunk: number; ms: number; dispatches: number; vsFirst: number }[];
}

/**
 * bench/chunk-ab.ts's runs in a log: a `# prefill of ...` or `# LoRA training step ...` title, then
 * after the `chunk  median ms ...` header one row a chunk (`chunk ms tok/s dispatches ratio x`).
 * Other lines are skipped; a log without one gives none.
 */
export function parseChunkAb(text: string): ChunkAb[] {
  const out: ChunkAb[] = [];
  let title: string | null = null;
  let open: ChunkAb | null = null;
  for (const line of text.split('\n')) {
    if (/^# (prefill of|LoRA training step)/.test(line)) {
      title = line.slice(2);
      open = null;
    } else if (title !== null && /^chunk\s+median ms/.test(line)) {
      out.push((open = { title, rows: [] }));
      title = null;
    } else if (open) {
      const m = /^\s*(\d+)\s+([\d.]+)\s+\d+\s+(\d+)\s+([\d.]+)x\s*$/.exec(line);
      if (m) open.rows.push({ chunk: +m[1]!, ms: +m[2]!, dispatches: +m[3]!, vsFirst: +m[4]! });
      else open = null;
    }
  }
  return out;
}

/** The chunk A/Bs' Markdown lines: per run its title, then each chunk's median ms, dispatches and rate over the first's. */
function chunkLines(runs: ChunkAb[]): string[] {
  const out: string[] = [];
  for (const r of runs) {
    out.push(
      '',
      `${r.title} (round.log, bench/chunk-ab.ts, alternated; > 1: faster than the first chunk):`,
      '',
      '| chunk | median ms | dispatches | rate over the first |',
      '|---|---|---|---|',
      ...r.rows.map((x) => `| ${x.chunk} | ${num(x.ms, 1)} | ${x.dispatches} | ${num(x.vsFirst, 2)}x |`),
    );
  }
  return out;
}

/** One table of bench/gemv-sweep.ts: a product at a batch, each layout's median time. */
export interface GemvSweep {
  op: string;
  batch: number;
  rows: { lanes: string; cols: string; us: number; gbs: number; ofCopy: number; kernel: string; auto: boolean }[];
}

/**
 * bench/gemv-sweep.ts's tables in a log: each `## op B=T (...)` header opens one, and each row
 * `lanes cols us GB/s %copy kernel [<- fastest] [<- 'auto']` adds a layout. Other lines are
 * skipped; throws where there is no table.
 */
export function parseGemvSweep(text: string): GemvSweep[] {
  const out: GemvSweep[] = [];
  let cur: GemvSweep | null = null;
  for (const line of text.split('\n')) {
    const h = /^## (\w+) B=(\d+) \(/.exec(line);
    if (h) {
      out.push((cur = { op: h[1]!, batch: Number(h[2]), rows: [] }));
      continue;
    }
    const m = /^(auto|\d+)\s+(auto|\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%\s+(\S+)(.*)$/.exec(line);
    if (m && cur) {
      const [, lanes, cols, us, gbs, ofCopy, kernel, rest] = m as unknown as string[];
      cur.rows.push({
        lanes: lanes!,
        cols: cols!,
        us: Number(us),
        gbs: Number(gbs),
        ofCopy: Number(ofCopy) / 100,
        kernel: kernel!,
        auto: rest!.includes("<- 'auto'"),
      });
    } else if (!line.trim() || /^lanes\s+cols/.test(line)) continue;
    else cur = null; // another script's line ends a table
  }
  const tables = out.filter((t) => t.rows.length > 0);
  if (tables.length === 0) throw new Error('no "## op B=T" table of bench/gemv-sweep.ts');
  return tables;
}

/** The sweep's Markdown: per product and batch the fastest layout, 'auto''s, and their times. */
function gemvSweepLines(tables: GemvSweep[]): string[] {
  const out = [
    "Decode GEMV layouts (gemv-ab.log, bench/gemv-sweep.ts: staged lanes a column x columns a thread, median us a call over the layers' weights in turn): the fastest and 'auto''s, which 'auto' should become where they differ:",
    '',
    "| product | B | fastest (lanes / cols) | us | GB/s | of copy | 'auto' (lanes / cols) | 'auto' / fastest |",
    '|---|---|---|---|---|---|---|---|',
  ];
  for (const t of tables) {
    const best = t.rows.reduce((a, b) => (b.us < a.us ? b : a));
    const auto = t.rows.find((r) => r.auto);
    const layout = (r: GemvSweep['rows'][number]) => `${r.lanes} / ${r.cols}`;
    out.push(
      `| ${t.op} | ${t.batch} | ${layout(best)} | ${num(best.us)} | ${sig(best.gbs)} | ${pct(best.ofCopy)} | ` +
        `${auto ? layout(auto) : 'not swept'} | ${auto ? num(auto.us / best.us, 2) : ''} |`,
    );
  }
  return out;
}

/** One bench/profile.ts run: its kernel switches ('' for none), weight format and each unit's GPU time. */
export interface ProfileRun {
  kernels: string;
  /** The header's weight format (q4, bf16), '' where it names none. */
  weights: string;
  units: { name: string; gpuMs: number; dispatches: number; wallMs: number }[];
}

/**
 * bench/profile.ts's runs in a log, in order: each header line (`# adapter; model with L of N
 * layers, ...; kernels k=v,...`) opens a run and each `## unit: GPU x ms in n dispatches per unit;
 * unprofiled wall y ms per unit` line adds a unit to it. Other scripts' lines are skipped.
 */
export function parseProfiles(text: string): ProfileRun[] {
  const runs: ProfileRun[] = [];
  for (const line of text.split('\n')) {
    const head = /^# .* with \d+ of \d+ layers, .*LoRA r \d+ on all projections(?:; kernels (\S+))?\s*$/.exec(line);
    if (head) {
      runs.push({ kernels: head[1] ?? '', weights: /, (\w+) weights,/.exec(line)?.[1] ?? '', units: [] });
      continue;
    }
    const u = /^## (.+): GPU ([\d.]+) ms in ([\d.]+) dispatches per unit; unprofiled wall ([\d.]+) ms per unit/.exec(
      line,
    );
    if (u && runs.length > 0)
      runs[runs.length - 1]!.units.push({
        name: u[1]!,
        gpuMs: Number(u[2]),
        dispatches: Number(u[3]),
        wallMs: Number(u[4]),
      });
  }
  return runs.filter((r) => r.units.length > 0);
}

/**
 * A log's profiles side by side where it has two or more: per unit (in the order they first
 * appear), each run's GPU ms and its ratio to the first run's with that unit and weight format
 * (its ms over theirs: > 1 is slower), and each run's kernel switches (and weights, where the runs' differ:
 * round.log's q4 and bf16 profiles). Runs of other shapes (attention-ab.log's B = 1 and 4) leave
 * each other's cells empty.
 */
function profileLines(file: string, runs: ProfileRun[]): string[] {
  if (runs.length < 2) return [];
  const mixed = new Set(runs.map((r) => r.weights)).size > 1;
  const name = (r: ProfileRun) =>
    `${r.kernels ? `\`${r.kernels}\`` : "'auto'"}${mixed && r.weights ? ` ${r.weights}` : ''}`;
  const out = [
    `Profiles side by side (${file}, bench/profile.ts, one after another on the same machine): GPU ms a unit, and over the first's with the same weights (> 1: slower):`,
    '',
    `| unit | ${runs.map(name).join(' | ')} |`,
    `|---|${runs.map(() => '---|').join('')}`,
  ];
  const names = [...new Set(runs.flatMap((r) => r.units.map((u) => u.name)))];
  for (const name of names) {
    const at = runs.map((r) => r.units.find((x) => x.name === name));
    // Each cell against the first run with this unit and this run's weights.
    const baseOf = (i: number) => at.find((v, j) => v !== undefined && runs[j]!.weights === runs[i]!.weights)!;
    const cells = at.map((v, i) =>
      !v ? '' : v === baseOf(i) ? num(v.gpuMs, 2) : `${num(v.gpuMs, 2)} (${num(v.gpuMs / baseOf(i).gpuMs, 2)}x)`,
    );
    out.push(`| ${name} | ${cells.join(' | ')} |`);
  }
  return out;
}

/**
 * bench/attention-ab.ts's ratio lines: per (T, op), each variant's median time over the base's
 * (the last variant of its --variants); and its packed-tree lines as printed.
 */
export interface AttentionAb {
  base: string;
  rows: { T: number; op: string; ratios: Map<string, number> }[];
  tree: string[];
}

/** Parses attention-ab.log (other scripts' lines in it are skipped); throws where it has no ratio line. */
export function parseAttentionAb(text: string): AttentionAb {
  const out: AttentionAb = { base: '', rows: [], tree: [] };
  for (const line of text.split('\n')) {
    const m = /^T=(\d+) (attention [^:]+): (\S+) \/ (\S+) = ([\d.]+) \(medians\)/.exec(line);
    if (m) {
      const [, T, op, variant, base, ratio] = m as unknown as [string, string, string, string, string, string];
      out.base = base;
      let row = out.rows.find((r) => r.T === Number(T) && r.op === op);
      if (!row) out.rows.push((row = { T: Number(T), op, ratios: new Map() }));
      row.ratios.set(variant, Number(ratio));
    } else if (/^T=\d+ \w+ \[[^\]]+\]: tree \/ causal = /.test(line)) out.tree.push(line);
  }
  if (out.rows.length === 0) throw new Error('no "T=... attention ...: a / b = x (medians)" line');
  return out;
}

/** The attention section's Markdown lines: the ratios per (T, op) and the fastest variant of each. */
function attentionLines(ab: AttentionAb): string[] {
  const variants = [...new Set(ab.rows.flatMap((r) => [...r.ratios.keys()]))];
  const out = [
    `Training and prefill attention side by side (attention-ab.log, bench/attention-ab.ts): each variant's median time over ${ab.base}'s (> 1: ${ab.base} is faster), and the fastest:`,
    '',
    `| T | op | ${variants.join(' | ')} | fastest |`,
    `|---|---|${variants.map(() => '---|').join('')}---|`,
  ];
  for (const r of ab.rows) {
    let fastest = ab.base,
      best = 1;
    for (const [v, x] of r.ratios) if (x < best) [fastest, best] = [v, x];
    const cells = variants.map((v) => (r.ratios.has(v) ? num(r.ratios.get(v)!, 2) : ''));
    out.push(`| ${r.T} | ${r.op.replace(/^attention /, '')} | ${cells.join(' | ')} | ${fastest} |`);
  }
  if (ab.tree.length)
    out.push('', 'Packed trees (time over the causal pass, minima):', '', ...ab.tree.map((l) => `- ${l}`));
  return out;
}

/** The full model's layers (Qwen3-4B). */
const FULL_LAYERS = 36;
export const TARGETS = { decodeOfCopy: 0.7, loraVsPeft: 3, roundSeconds: 60 } as const;

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
/** Three significant digits: GB/s and tok/s from SwiftShader's 0.04 to a GPU's 3,000. */
const sig = (x: number) => Number(x.toPrecision(3)).toLocaleString('en-US', { maximumFractionDigits: 6 });
const num = (x: number, d = 1) => x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d });

/** The last JSON object in a log (scripts/bench_peft_step.py prints warnings before it). */
export function lastJsonObject(text: string): unknown {
  const start = text.lastIndexOf('\n{') >= 0 ? text.lastIndexOf('\n{') + 1 : text.indexOf('{');
  if (start < 0) throw new Error('no JSON object in it');
  return JSON.parse(text.slice(start));
}

function layersOf(shape: string): number | null {
  const m = / L=(\d+)/.exec(shape);
  return m ? Number(m[1]) : null;
}

/** The report's Markdown lines. */
export function deviceReport(run: DeviceRun): string[] {
  const out: string[] = [];
  const bench = typeof run.bench === 'object' ? run.bench : null;
  const round = typeof run.round === 'object' ? run.round : null;
  const peft = typeof run.peft === 'object' ? run.peft : null;
  const why = (x: unknown, file: string) => (typeof x === 'string' ? `${file}: ${x}` : `${file}: missing`);

  const head = bench ?? round;
  if (head) {
    const roof = bench?.roofline;
    out.push(
      `Machine: ${head.adapter} (${head.architecture}), ${head.runtime}, ${head.date}` +
        (roof ? `; measured roofline: copy ${num(roof.copyGBs)} GB/s, FMA ${num(roof.fmaGFLOPs)} GFLOP/s` : ''),
    );
  } else out.push(`Machine: unknown (${why(run.bench, 'bench.json')})`);

  // gpu-check: its closing line, and every failed line.
  if (typeof run.summary === 'string') {
    const verdict = /gpu-check: (all \d+ checks passed|\d+ of \d+ checks FAILED)/.exec(run.summary);
    const failed = run.summary.split('\n').filter((l) => l.startsWith('FAIL '));
    out.push(
      verdict
        ? `Kernels against PyTorch on this GPU (bench/gpu-check.ts): ${verdict[1]}${failed.length ? `: ${failed.map((l) => l.slice(5)).join('; ')}` : ''}`
        : 'Kernels against PyTorch on this GPU (bench/gpu-check.ts): no verdict in summary.log (did it run to the end?)',
    );
  } else out.push(`Kernels against PyTorch on this GPU: ${why(run.summary, 'summary.log')}`);

  out.push('', '| target | measured | goal | met |', '|---|---|---|---|');
  const row = (target: string, measured: string, goal: string, met: string) =>
    out.push(`| ${target} | ${measured} | ${goal} | ${met} |`);

  // Decode at Qwen3-4B q4 shapes.
  const decodes = bench
    ? bench.records.filter((x) => /^4b decode B=\d+ @ctx \d+/.test(x.name) && / q4 /.test(x.shape))
    : [];
  if (!bench)
    row('decode, Qwen3-4B q4', why(run.bench, 'bench.json'), `>= ${pct(TARGETS.decodeOfCopy)} of copy`, 'not measured');
  else if (!decodes.length)
    row(
      'decode, Qwen3-4B q4',
      'no 4b q4 decode record in bench.json',
      `>= ${pct(TARGETS.decodeOfCopy)} of copy`,
      'not measured',
    );
  const loops = decodes.some((d) => d.name.includes('generate loop'));
  const deepest = Math.max(0, ...decodes.map((d) => layersOf(d.shape) ?? 0));
  for (const d of decodes) {
    const judged =
      /^4b decode B=1 @ctx 128 /.test(d.name) &&
      d.name.includes('generate loop') === loops &&
      (layersOf(d.shape) ?? 0) === deepest;
    const of = d.ofCopy ?? null;
    row(
      `${d.name.replace(/^4b /, '')}, 4B q4 (L=${layersOf(d.shape)} of ${FULL_LAYERS})${judged ? '' : ' (for reference)'}`,
      `${num(d.seconds * 1000, 2)} ms/step, ${sig(d.gbs)} GB/s${of === null ? '' : ` = ${pct(of)} of copy`}`,
      judged ? `>= ${pct(TARGETS.decodeOfCopy)} of copy` : '',
      !judged ? '' : of === null ? 'no roofline' : of >= TARGETS.decodeOfCopy ? 'yes' : 'no',
    );
  }

  // The LoRA step against PyTorch + PEFT.
  const steps = bench ? bench.records.filter((x) => /^4b LoRA step \d+ tok/.test(x.name)) : [];
  const goal = `PEFT / ours <= ${TARGETS.loraVsPeft}x`;
  if (!bench || !peft) {
    row(
      'LoRA step, 4B shapes',
      [bench ? '' : why(run.bench, 'bench.json'), peft ? '' : why(run.peft, 'peft.log')].filter(Boolean).join('; '),
      goal,
      'not measured',
    );
  } else {
    // Ours at PEFT's tokens and layers, with PEFT's weight type where both ran (bf16 against bf16).
    const same = steps.filter(
      (x) => Number(/LoRA step (\d+) tok/.exec(x.name)![1]) === peft.tokens && layersOf(x.shape) === peft.layers,
    );
    // Of the recomputing step and the one keeping every layer (PEFT eager keeps every activation too), the faster.
    const ofDtype = same.filter((x) => x.shape.split(' ')[1] === peft.dtype);
    const mine = (ofDtype.length ? ofDtype : same).reduce<(typeof same)[number] | undefined>(
      (a, x) => (!a || x.tokPerS! > a.tokPerS! ? x : a),
      undefined,
    );
    if (!mine) {
      row(
        'LoRA step, 4B shapes',
        `no "4b LoRA step ${peft.tokens} tok" record at L=${peft.layers} in bench.json`,
        goal,
        'not measured',
      );
    } else {
      const ratio = peft.tok_per_s / mine.tokPerS!;
      row(
        `LoRA step, ${peft.tokens} tokens, r=${peft.r}, 4B shapes (L=${peft.layers} of ${FULL_LAYERS}, ${mine.shape.split(' ')[1]} weights)`,
        `ours ${sig(mine.tokPerS!)} tok/s (${num(mine.seconds * 1000)} ms${/every layer kept/.test(mine.name) ? ', every layer kept' : ''}), ${peft.engine} ${peft.dtype} on ${peft.device} ${sig(peft.tok_per_s)} tok/s: PEFT / ours = ${num(ratio, 2)}x`,
        goal,
        ratio <= TARGETS.loraVsPeft ? 'yes' : 'no',
      );
    }
  }

  // The default round.
  // At the most layers round.json holds (all 36 where the run played them).
  const totals = round ? round.records.filter((x) => /^round: round total/.test(x.name) && /^4b /.test(x.shape)) : [];
  const total = totals.sort((a, b) => (layersOf(b.shape) ?? 0) - (layersOf(a.shape) ?? 0))[0];
  const roundGoal = `< ${TARGETS.roundSeconds} s at ${FULL_LAYERS} layers`;
  if (!round) row('default SpyRL round, 4B', why(run.round, 'round.json'), roundGoal, 'not measured');
  else if (!total)
    row(
      'default SpyRL round, 4B',
      'no "round: round total" record at 4b shapes in round.json',
      roundGoal,
      'not measured',
    );
  else {
    const L = layersOf(total.shape) ?? FULL_LAYERS;
    const bound = (total.seconds * FULL_LAYERS) / L;
    const met =
      bound < TARGETS.roundSeconds ? 'yes' : total.seconds >= TARGETS.roundSeconds ? 'no' : 'open (between the bounds)';
    row(
      `default SpyRL round, 4B shapes (${total.shape.replace(/^4b /, '')})`,
      L >= FULL_LAYERS
        ? `${num(total.seconds)} s with all ${L} layers`
        : `${num(total.seconds)} s with ${L} layers; ${FULL_LAYERS} layers: at most ${num(bound)} s (x ${FULL_LAYERS}/${L})`,
      roundGoal,
      met,
    );
    out.push('', `Round by stage (${total.shape}; the last round of the run, the ones before it warm up):`, '');
    for (const x of round.records.filter((r) => r.group === 'e2e' && /^round/.test(r.name) && r.shape === total.shape))
      out.push(`- ${x.name}: ${num(x.seconds, 2)} s${x.tokPerS ? ` (${sig(x.tokPerS)} tok/s)` : ''}`);
  }

  // The attention kernels side by side: which 'auto' should take.
  if (run.attention !== undefined) {
    out.push('');
    if (typeof run.attention === 'object') out.push(...attentionLines(run.attention));
    else out.push(`Attention side by side: ${why(run.attention, 'attention-ab.log')}`);
  }
  // The decode GEMV's layouts swept (gemv-ab.log).
  if (run.gemvSweep !== undefined) {
    out.push('');
    if (typeof run.gemvSweep === 'object') out.push(...gemvSweepLines(run.gemvSweep));
    else out.push(`Decode GEMV layouts: ${why(run.gemvSweep, 'gemv-ab.log')}`);
  }
  // The prefill and MLP chunks side by side (round.log).
  if (typeof run.chunks === 'object') out.push(...chunkLines(run.chunks));
  // Profiles run with other kernel switches beside the defaults' (round.log, gemv-ab.log).
  for (const p of run.profiles ?? []) {
    if (typeof p.runs === 'string') continue; // a missing log: its other rows say so
    const lines = profileLines(p.file, p.runs);
    if (lines.length) out.push('', ...lines);
  }
  return out;
}

/** Reads a device run's folder: what is missing or malformed becomes the reason in its rows. */
export async function readDeviceRun(dir: string): Promise<DeviceRun> {
  const read = async <T>(file: string, parse: (text: string) => T): Promise<T | string> => {
    let text: string;
    try {
      text = await readFile(join(dir, file), 'utf8');
    } catch {
      return 'missing';
    }
    try {
      return parse(text);
    } catch (e) {
      return `not readable (${(e as Error).message})`;
    }
  };
  const report = (text: string) => {
    const r = JSON.parse(text) as BenchReport;
    if (!Array.isArray(r.records)) throw new Error('no records');
    return r;
  };
  return {
    bench: await read('bench.json', report),
    round: await read('round.json', report),
    peft: await read('peft.log', (t) => {
      const p = lastJsonObject(t) as PeftStep;
      if (typeof p.tok_per_s !== 'number' || typeof p.tokens !== 'number') throw new Error('no tok_per_s or tokens');
      return p;
    }),
    summary: await read('summary.log', (t) => t),
    attention: await read('attention-ab.log', parseAttentionAb),
    gemvSweep: await read('gemv-ab.log', parseGemvSweep),
    chunks: await read('round.log', parseChunkAb),
    profiles: [
      { file: 'round.log', runs: await read('round.log', parseProfiles) },
      { file: 'gemv-ab.log', runs: await read('gemv-ab.log', parseProfiles) },
      { file: 'attention-ab.log', runs: await read('attention-ab.log', parseProfiles) },
    ],
  };
}

if (process.argv[1]?.endsWith('device-report.ts')) {
  const dir = process.argv[2];
  if (!dir) {
    console.error('usage: npx tsx bench/device-report.ts DIR   (the files of scripts/device-run.sh)');
    process.exit(2);
  }
  console.log(deviceReport(await readDeviceRun(dir)).join('\n'));
}
