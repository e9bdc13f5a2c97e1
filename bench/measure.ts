// The arithmetic of the benchmark, shared by Node (bench/run.ts) and the browser (bench/browser.ts):
// one record per measurement, the roofline fractions, the timing loop, the table and the JSON.
// Browser-safe: no node: imports here or in anything this file imports.
import type { Gpu } from '../src/gpu/index.ts';

/** What a record measures: the roofline probes, one op, the model end to end, or the peer engine. */
export type Group = 'roofline' | 'op' | 'e2e' | 'peer';

export interface BenchRecord {
  group: Group;
  name: string;
  /** The shapes, in the project's dimension names (docs/ENGINE.md). */
  shape: string;
  /** FLOPs and bytes of one call, as written out in the code that made the record. */
  flops: number;
  bytes: number;
  /** Seconds per call (mean over `reps` calls after a warm-up call). */
  seconds: number;
  reps: number;
  gflops: number;
  gbs: number;
  /** Tokens per call when the call processes tokens (then tok/s = tokens / seconds). */
  tokens?: number;
  tokPerS?: number;
  /** Fractions of the measured roofline: GB/s of the copy kernel, GFLOP/s of the FMA kernel. */
  ofCopy?: number;
  ofFma?: number;
  /** Time the roofline allows, max(bytes / copy, flops / fma), over the time measured: 1 = at the roof. */
  ofRoof?: number;
  note?: string;
}

export interface Roofline {
  /** Achievable bandwidth, bytes read + written per second by a plain vec4 copy. */
  copyGBs: number;
  /** Achievable f32 rate of register FMAs (2 FLOPs each). */
  fmaGFLOPs: number;
}

export interface BenchReport {
  adapter: string;
  architecture: string;
  features: string[];
  mode: 'quick' | 'full';
  /** Where it ran: 'node' (Dawn) or the browser's user agent. */
  runtime: string;
  date: string;
  /** The kernel switches the run set (bench --kernels); absent: the defaults ('auto'). */
  kernels?: string;
  roofline?: Roofline;
  records: BenchRecord[];
  /** Peer comparisons: ours over theirs, > 1 = we are faster. */
  ratios?: { name: string; ours: number; peer: number; ratio: number; unit: string }[];
  /** Peer logits check: max |ours - peer| / max |peer| over the compared positions. */
  peerLogitsRelDiff?: number;
  /** The peer's engine and session settings. */
  peerSession?: string;
}

/** A record from what was measured; the rates and fractions are computed here and only here. */
export function makeRecord(
  m: {
    group: Group;
    name: string;
    shape: string;
    flops: number;
    bytes: number;
    seconds: number;
    reps: number;
    tokens?: number;
    note?: string;
  },
  roof?: Roofline,
): BenchRecord {
  if (!(m.seconds > 0)) throw new RangeError(`${m.name}: time ${m.seconds} s is not positive`);
  const gflops = m.flops / m.seconds / 1e9;
  const gbs = m.bytes / m.seconds / 1e9;
  const r: BenchRecord = { ...m, gflops, gbs };
  if (m.tokens !== undefined) r.tokPerS = m.tokens / m.seconds;
  if (roof && m.group !== 'roofline') applyRoofline(r, roof);
  return r;
}

/** Sets the record's fractions of `roof` (see BenchRecord). */
export function applyRoofline(r: BenchRecord, roof: Roofline): void {
  r.ofCopy = r.gbs / roof.copyGBs;
  r.ofFma = r.gflops / roof.fmaGFLOPs;
  const roofSeconds = Math.max(r.bytes / (roof.copyGBs * 1e9), r.flops / (roof.fmaGFLOPs * 1e9));
  r.ofRoof = roofSeconds / r.seconds;
}

export interface TimeOptions {
  /** Keep repeating until this much time is spent (after one timed call). */
  minSeconds: number;
  maxReps: number;
}

/**
 * Seconds per call of `encode` (which only encodes GPU work, or awaits its own): one warm-up call
 * (pipelines compiled, pool filled), one timed call to size the loop, then `reps` calls
 * encoded back to back and one wait for the GPU. `after` runs once per call after the wait
 * (releasing what the call returned).
 */
export async function timeCalls<T>(
  gpu: Gpu,
  encode: () => T | Promise<T>,
  opts: TimeOptions,
  after?: (x: T) => void,
): Promise<{ seconds: number; reps: number }> {
  const once = async (): Promise<number> => {
    const t0 = performance.now();
    const x = await encode();
    await gpu.sync();
    after?.(x);
    return (performance.now() - t0) / 1000;
  };
  await once();
  const first = await once();
  const reps = Math.max(1, Math.min(opts.maxReps, Math.floor(opts.minSeconds / Math.max(first, 1e-6))));
  if (reps === 1) return { seconds: first, reps: 1 };
  const outs: T[] = [];
  const t0 = performance.now();
  for (let i = 0; i < reps; i++) outs.push(await encode());
  await gpu.sync();
  const seconds = (performance.now() - t0) / 1000 / reps;
  if (after) for (const x of outs) after(x);
  return { seconds, reps };
}

// ---- output ---------------------------------------------------------------------------------------

const num = (x: number, d = 1) =>
  !Number.isFinite(x) ? '-' : Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 1 ? x.toFixed(d) : x.toPrecision(2);
const pct = (x: number | undefined) => (x === undefined ? '' : `${(100 * x).toFixed(x < 0.01 ? 2 : 1)}%`);

/** Engineering-style count: 1.2 G, 340 M, 5.1 k. */
export function si(x: number): string {
  const units: [number, string][] = [
    [1e12, 'T'],
    [1e9, 'G'],
    [1e6, 'M'],
    [1e3, 'k'],
  ];
  if (x === 0) return '0 ';
  for (const [v, u] of units) if (Math.abs(x) >= v) return `${num(x / v)} ${u}`;
  return `${num(x)} `;
}

/** A fixed-width table of the records (one line each), with a header. */
export function formatTable(records: readonly BenchRecord[]): string {
  const head = [
    'group',
    'name',
    'shape',
    'FLOP/call',
    'bytes/call',
    'ms/call',
    'reps',
    'GFLOP/s',
    'GB/s',
    'tok/s',
    '%copy',
    '%fma',
    '%roof',
  ];
  const rows = records.map((r) => [
    r.group,
    r.name,
    r.shape,
    si(r.flops),
    `${si(r.bytes)}B`,
    num(r.seconds * 1000, 2),
    String(r.reps),
    num(r.gflops),
    num(r.gbs),
    r.tokPerS === undefined ? '' : num(r.tokPerS),
    pct(r.ofCopy),
    pct(r.ofFma),
    pct(r.ofRoof),
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const left = new Set([0, 1, 2]);
  const line = (cells: string[]) =>
    cells.map((c, i) => (left.has(i) ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ');
  return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

/** The peer ratios as lines: "decode tok/s  ours 12.3  onnxruntime-web 10.1  ratio 1.22x". */
export function formatRatios(ratios: NonNullable<BenchReport['ratios']>): string {
  return ratios
    .map(
      (r) =>
        `${r.name.padEnd(28)} ours ${num(r.ours).padStart(8)}  peer ${num(r.peer).padStart(8)} ${r.unit}  ratio ${r.ratio.toFixed(2)}x`,
    )
    .join('\n');
}
