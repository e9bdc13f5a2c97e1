// The downloadable adapter: a zip of the PEFT files plus a README model card, and the reverse
// (an uploaded zip or folder back into files the trainer can continue from).
import { Inflate, strToU8, zipSync } from 'fflate';
import { configLeaves, type SpyRLConfig } from '../game/config.ts';
import { ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, OPTIMIZER_FILE, TRAINER_STATE_FILE } from '../model/peft.ts';
import { unsafePathReason } from '../model/paths.ts';
import type { TrainEvent } from '../train/events.ts';
import type { RunFiles } from './runStorage.ts';

/** Running totals of a run, fed by its events; what the model card reports. */
export interface RunSummary {
  rounds: number;
  optimizerSteps: number;
  /** Last `window` rounds. */
  recent: { rounds: number; spyCaughtRate: number; voteAccuracy: number; civilianReward: number; spyReward: number };
  lastUpdate: { loss: number; kl: number | null; gradNorm: number } | null;
  lastEval: { round: number; base: number; adapter: number } | null;
}

const WINDOW = 20;

export class RunSummarizer {
  private rounds: { caught: number; accuracy: number; civilian: number; spy: number }[] = [];
  private steps = 0;
  private lastUpdate: RunSummary['lastUpdate'] = null;
  private lastEval: RunSummary['lastEval'] = null;
  private roundsSeen = 0;

  constructor(startRound = 0) {
    this.roundsSeen = startRound;
  }

  add(e: TrainEvent): void {
    if (e.type === 'round-done') {
      const r = e.record;
      const civ = r.rewards.summary.filter((_, seat) => seat !== r.spySeat);
      this.rounds.push({
        caught: r.metrics.spyCaught ? 1 : 0,
        accuracy: r.metrics.voteAccuracy,
        civilian: civ.reduce((a, b) => a + b, 0) / Math.max(1, civ.length),
        spy: r.rewards.summary[r.spySeat] ?? 0,
      });
      if (this.rounds.length > WINDOW) this.rounds.shift();
      this.roundsSeen = Math.max(this.roundsSeen, e.round + 1);
    } else if (e.type === 'update' && !e.skipped) {
      this.steps = Math.max(this.steps, e.step);
      this.lastUpdate = { loss: e.loss, kl: e.kl, gradNorm: e.gradNorm };
    } else if (e.type === 'eval') {
      this.lastEval = { round: e.round, base: e.base, adapter: e.adapter };
    }
  }

  summary(): RunSummary {
    const n = this.rounds.length;
    const mean = (k: 'caught' | 'accuracy' | 'civilian' | 'spy') =>
      n ? this.rounds.reduce((a, r) => a + r[k], 0) / n : 0;
    return {
      rounds: this.roundsSeen,
      optimizerSteps: this.steps,
      recent: {
        rounds: n,
        spyCaughtRate: mean('caught'),
        voteAccuracy: mean('accuracy'),
        civilianReward: mean('civilian'),
        spyReward: mean('spy'),
      },
      lastUpdate: this.lastUpdate,
      lastEval: this.lastEval,
    };
  }
}

const f3 = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : String(x));

/** README.md for the adapter: base model, config, rounds, metrics and how to load it with PEFT. */
export function modelCard(opts: {
  baseModel: string;
  baseIsHub: boolean;
  config: SpyRLConfig;
  summary: RunSummary;
  date: Date;
}): string {
  const { baseModel, baseIsHub, config, summary: s } = opts;
  const loadFrom = baseIsHub ? baseModel : 'path/to/the/base/model';
  const metrics = [
    ['rounds played', String(s.rounds)],
    ['optimizer steps', String(s.optimizerSteps)],
    [`spy caught (last ${s.recent.rounds} rounds)`, f3(s.recent.spyCaughtRate)],
    [`civilian vote accuracy (last ${s.recent.rounds} rounds)`, f3(s.recent.voteAccuracy)],
    [`civilian summary reward (last ${s.recent.rounds} rounds)`, f3(s.recent.civilianReward)],
    [`spy summary reward (last ${s.recent.rounds} rounds)`, f3(s.recent.spyReward)],
    ...(s.lastUpdate
      ? [
          ['last loss', f3(s.lastUpdate.loss)],
          ['last KL', s.lastUpdate.kl === null ? 'off (klBeta 0: not computed)' : f3(s.lastUpdate.kl)],
          ['last grad norm', f3(s.lastUpdate.gradNorm)],
        ]
      : []),
    ...(s.lastEval
      ? [
          [`ROUGE-L F1, held-out reports, base (round ${s.lastEval.round})`, f3(s.lastEval.base)],
          [`ROUGE-L F1, held-out reports, adapter (round ${s.lastEval.round})`, f3(s.lastEval.adapter)],
        ]
      : [['ROUGE-L on held-out reports', 'not evaluated in this run']]),
  ];
  const settings = configLeaves(config)
    .filter(([path]) => !path.startsWith('prompts.'))
    .map(([path, v]) => `| \`${path}\` | \`${JSON.stringify(v)}\` |`);
  return `---
${baseIsHub ? `base_model: ${baseModel}\n` : ''}library_name: peft
tags:
- lora
- spyrl
- self-play
- summarization
---

# SpyRL LoRA adapter for ${baseModel}

A LoRA adapter trained in the browser with SpyRL Playground by self-play in "Who Is the Spy?":
each round ${config.groupSize} copies of the model summarize a report, one of them (the spy) from a
copy with ${Math.round(config.maskRatio * 100)}% of it removed, then each votes on who the spy is.
Civilians are rewarded for catching the spy and for summaries nobody suspects, which rewards
complete, faithful summaries.

- Base model: \`${baseModel}\`${baseIsHub ? '' : ' (loaded from a local folder or the bundled demo checkpoint)'}
- LoRA: r = ${config.lora.r}, alpha = ${config.lora.alpha}, targets ${config.lora.targetModules.join(', ')}
- Saved: ${opts.date.toISOString()}

## Metrics

| metric | value |
|---|---|
${metrics.map(([k, v]) => `| ${k} | ${v} |`).join('\n')}

## Training settings

| setting | value |
|---|---|
${settings.join('\n')}

## Load with PEFT

\`\`\`python
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel

base = AutoModelForCausalLM.from_pretrained("${loadFrom}", torch_dtype="bfloat16")
tokenizer = AutoTokenizer.from_pretrained("${loadFrom}")
model = PeftModel.from_pretrained(base, "path/to/this/unzipped/folder")
model = model.merge_and_unload()  # optional: fold the adapter into the weights
\`\`\`
`;
}

export function zipFiles(files: RunFiles): Uint8Array {
  const entries: Record<string, Uint8Array> = {};
  for (const [name, f] of Object.entries(files)) entries[name] = typeof f === 'string' ? strToU8(f) : f;
  return zipSync(entries, { level: 6 });
}

// ---- reading an upload back: only the known files, each within its cap ----------------------

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;

/** What an adapter upload may hold and how large each file may be once inflated. */
export interface AdapterUploadLimits {
  /** Known base names and the most bytes each may hold; every other file is skipped unread. */
  files: Readonly<Record<string, number>>;
  /** All known files together. */
  total: number;
  /** Entries in one zip's directory (known or not). */
  entries: number;
}

/**
 * The PEFT files, a run's checkpoint extras (what SpyRLTrainer.checkpointFiles() writes) and the
 * model card. The caps are far above what a real run writes (a Qwen3-4B LoRA at r = 256 on every
 * projection is about 1 GiB in f32, its AdamW moments twice that) and far below what would take
 * the worker's memory.
 */
export const ADAPTER_UPLOAD_LIMITS: AdapterUploadLimits = {
  files: {
    [ADAPTER_CONFIG_FILE]: MiB,
    [ADAPTER_WEIGHTS_FILE]: 2 * GiB,
    [OPTIMIZER_FILE]: 4 * GiB,
    [TRAINER_STATE_FILE]: 16 * MiB,
    'pending_samples.json': 64 * MiB,
    'run.jsonl': 256 * MiB,
    'spyrl_config.json': MiB,
    'README.md': MiB,
  },
  total: 6 * GiB,
  entries: 10_000,
};

const mb = (n: number) => (n >= MiB ? `${(n / MiB).toFixed(1)} MiB` : `${n} bytes`);

/** The base name a known file is kept under, or null for a path we skip (folders, macOS resource forks). */
function baseName(path: string): string | null {
  if (path.endsWith('/') || path.startsWith('__MACOSX/')) return null;
  return path.split('/').at(-1) || null;
}

/**
 * Keeps track of the known files taken so far: a second file with the same base name (a duplicate
 * entry, or two folders that flatten onto one name) and a file over its cap or over the total are
 * refused with the entry named.
 */
class UploadBudget {
  private readonly taken = new Map<string, string>();
  private total = 0;

  constructor(private readonly limits: AdapterUploadLimits) {}

  /** Whether to read `path` (declaring `size` bytes); throws when it must not be read at all. */
  admit(where: string, path: string, size: number): string | null {
    const name = baseName(path);
    if (name === null || !(name in this.limits.files)) return null;
    const unsafe = unsafePathReason(path);
    if (unsafe) throw new Error(`${where}: entry "${path}" is refused: ${unsafe}`);
    const first = this.taken.get(name);
    if (first !== undefined) {
      throw new Error(
        first === path
          ? `${where}: entry "${path}" appears twice; an adapter has one ${name}`
          : `${where}: entries "${first}" and "${path}" both hold ${name}; an adapter has one (zip one adapter folder)`,
      );
    }
    const cap = this.limits.files[name]!;
    if (size > cap)
      throw new Error(`${where}: entry "${path}" declares ${mb(size)}, over the ${mb(cap)} cap for ${name}`);
    if (this.total + size > this.limits.total)
      throw new Error(
        `${where}: entry "${path}" takes the adapter's files to ${mb(this.total + size)}, over the ${mb(this.limits.total)} cap`,
      );
    this.taken.set(name, path);
    this.total += size;
    return name;
  }
}

/**
 * Files from zips (folders inside flattened to base names) or from a folder pick. Only the files
 * an adapter or checkpoint holds (ADAPTER_UPLOAD_LIMITS) are read; for a zip, each one's size is
 * checked from the zip's central directory before anything is inflated, and inflating stops at
 * the declared size.
 */
export async function readAdapterUpload(
  files: File[],
  limits: AdapterUploadLimits = ADAPTER_UPLOAD_LIMITS,
): Promise<RunFiles> {
  const out: RunFiles = {};
  const budget = new UploadBudget(limits);
  const keep = (name: string, bytes: Uint8Array) => {
    out[name] = /\.(json|jsonl|md)$/.test(name) ? new TextDecoder().decode(bytes) : bytes;
  };
  // Every admit() comes before any read, so a bad entry anywhere reads nothing.
  const reads: (() => Promise<void> | void)[] = [];
  for (const f of files) {
    if (f.name.toLowerCase().endsWith('.zip')) {
      // The whole zip is read: a zip larger than every known file together cannot be an adapter.
      if (f.size > limits.total + 64 * MiB)
        throw new Error(`${f.name}: ${mb(f.size)}, larger than an adapter may be (${mb(limits.total)})`);
      const bytes = new Uint8Array(await f.arrayBuffer());
      const entries = readZipDirectory(bytes, f.name, limits.entries);
      for (const e of entries) {
        const name = budget.admit(f.name, e.path, e.size);
        if (name) reads.push(() => keep(name, inflateEntry(bytes, e, f.name)));
      }
    } else {
      const name = budget.admit('the picked files', f.webkitRelativePath || f.name, f.size);
      if (name) reads.push(async () => keep(name, new Uint8Array(await f.arrayBuffer())));
    }
  }
  for (const read of reads) await read();
  return out;
}

// ---- a zip's central directory, and one entry inflated within its declared size -----------------

export interface ZipEntry {
  /** As stored, with '\' (written by some Windows tools) read as '/'. */
  path: string;
  /** 0 stored, 8 deflate. */
  method: number;
  compressedSize: number;
  /** Uncompressed size, as the central directory declares it. */
  size: number;
  crc32: number;
  localHeaderOffset: number;
}

const u16 = (b: Uint8Array, at: number) => b[at]! | (b[at + 1]! << 8);
const u32 = (b: Uint8Array, at: number) => (b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16) | (b[at + 3]! << 24)) >>> 0;
const u64 = (b: Uint8Array, at: number) => u32(b, at) + u32(b, at + 4) * 2 ** 32;

/** The entries listed by a zip's central directory (ZIP64 included); nothing is inflated. */
export function readZipDirectory(
  bytes: Uint8Array,
  zipName: string,
  maxEntries = ADAPTER_UPLOAD_LIMITS.entries,
): ZipEntry[] {
  const bad = (why: string) => new Error(`${zipName}: not a readable zip (${why})`);
  // End of central directory: 22 bytes plus a comment of at most 65535.
  let eocd = -1;
  for (let i = bytes.length - 22; i >= Math.max(0, bytes.length - 22 - 65535); i--) {
    if (u32(bytes, i) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw bad('no end-of-central-directory record');
  let count = u16(bytes, eocd + 10);
  let dirOffset = u32(bytes, eocd + 16);
  if (eocd >= 20 && u32(bytes, eocd - 20) === 0x07064b50) {
    const z = u64(bytes, eocd - 12);
    if (z + 56 > bytes.length || u32(bytes, z) !== 0x06064b50) throw bad('broken ZIP64 end record');
    count = u64(bytes, z + 32);
    dirOffset = u64(bytes, z + 48);
  }
  if (count > maxEntries) throw bad(`${count} entries; an adapter zip holds a handful (at most ${maxEntries})`);
  const entries: ZipEntry[] = [];
  let at = dirOffset;
  for (let i = 0; i < count; i++) {
    if (at + 46 > bytes.length || u32(bytes, at) !== 0x02014b50) throw bad(`central directory entry ${i} is damaged`);
    const nameLen = u16(bytes, at + 28);
    const extraLen = u16(bytes, at + 30);
    const commentLen = u16(bytes, at + 32);
    const end = at + 46 + nameLen + extraLen + commentLen;
    if (end > bytes.length) throw bad(`central directory entry ${i} runs past the end`);
    const utf8 = (u16(bytes, at + 8) & 0x800) !== 0;
    const rawName = bytes.subarray(at + 46, at + 46 + nameLen);
    const path = (utf8 ? new TextDecoder() : new TextDecoder('latin1')).decode(rawName).replaceAll('\\', '/');
    let compressedSize = u32(bytes, at + 20);
    let size = u32(bytes, at + 24);
    let localHeaderOffset = u32(bytes, at + 42);
    // ZIP64: the fields that overflowed hold 0xffffffff and the real values sit in extra field 1, in this order.
    for (let x = at + 46 + nameLen; x + 4 <= at + 46 + nameLen + extraLen;) {
      const id = u16(bytes, x);
      const len = u16(bytes, x + 2);
      if (id === 0x0001) {
        let p = x + 4;
        if (size === 0xffffffff) {
          size = u64(bytes, p);
          p += 8;
        }
        if (compressedSize === 0xffffffff) {
          compressedSize = u64(bytes, p);
          p += 8;
        }
        if (localHeaderOffset === 0xffffffff) localHeaderOffset = u64(bytes, p);
      }
      x += 4 + len;
    }
    entries.push({
      path,
      method: u16(bytes, at + 10),
      compressedSize,
      size,
      crc32: u32(bytes, at + 16),
      localHeaderOffset,
    });
    at = end;
  }
  return entries;
}

let crcTable: Uint32Array | undefined;
function crc32(data: Uint8Array): number {
  if (!crcTable) {
    crcTable = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      crcTable[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (let i = 0; i < data.length; i++) c = crcTable[(c ^ data[i]!) & 0xff]! ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** Deflate input fed per push: one push inflates to at most ~1032× this, so a bomb stops early. */
const INFLATE_PIECE = 16 * KiB;

/**
 * One entry's bytes, never more than its declared size: the output buffer has exactly that size
 * and inflating stops at the first byte past it (the entry is then refused); a short or
 * corrupted entry fails its length or CRC-32 check.
 */
export function inflateEntry(bytes: Uint8Array, e: ZipEntry, zipName: string): Uint8Array {
  const fail = (why: string) => new Error(`${zipName}: entry "${e.path}" ${why}`);
  const h = e.localHeaderOffset;
  if (h + 30 > bytes.length || u32(bytes, h) !== 0x04034b50) throw fail('has no local header where the directory says');
  const start = h + 30 + u16(bytes, h + 26) + u16(bytes, h + 28);
  if (start + e.compressedSize > bytes.length) throw fail('runs past the end of the zip');
  const data = bytes.subarray(start, start + e.compressedSize);
  let out: Uint8Array;
  if (e.method === 0) {
    if (e.compressedSize !== e.size) throw fail(`is stored with ${e.compressedSize} bytes but declares ${e.size}`);
    out = data.slice();
  } else if (e.method === 8) {
    out = new Uint8Array(e.size);
    let at = 0;
    let over = false;
    const inflater = new Inflate((chunk) => {
      if (at + chunk.length > out.length) over = true;
      else {
        out.set(chunk, at);
        at += chunk.length;
      }
    });
    try {
      for (let p = 0; p < data.length && !over; p += INFLATE_PIECE)
        inflater.push(data.subarray(p, p + INFLATE_PIECE), p + INFLATE_PIECE >= data.length);
    } catch (x) {
      throw fail(`is not valid deflate data (${(x as Error).message})`);
    }
    if (over) throw fail(`inflates past the ${mb(e.size)} its zip directory declares: refused (a zip bomb?)`);
    if (at !== e.size) throw fail(`inflates to ${at} bytes, not the ${e.size} its zip directory declares`);
  } else {
    throw fail(`uses compression method ${e.method}; only stored (0) and deflate (8) are read`);
  }
  if (crc32(out) !== e.crc32) throw fail('fails its CRC-32 check: the zip is damaged');
  return out;
}
