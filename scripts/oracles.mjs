#!/usr/bin/env node
// `npm test` stage: the outside oracles. The committed golden fixtures (test/fixtures/golden,
// golden-lora, golden-q4), which the engine tests compare our WGSL engine against, must be exactly
// what Hugging Face's own code makes: scripts/golden_qwen3.py --impl hf (transformers'
// Qwen3ForCausalLM), scripts/golden_lora.py --impl peft (PEFT's PeftModel on it, with the
// plain-PyTorch autograd cross-checked inside the script) and scripts/golden_q4.py --impl hf.
// This reruns the three scripts in the reference venv (scripts/ref-venv.sh makes .venv-ref; .ci/run
// calls it) into a temporary folder and compares every file with the committed one: byte for byte,
// except the floating-point results of PyTorch's CPU kernels, whose last bits depend on the
// processor (its vector width and summation order: a 2026-12-04 CI machine, an AMD EPYC, made
// logits 1e-5 off those committed, 4e-7 of their scale). Those may differ by float32 rounding
// (ROUNDING below): f32 files and the F32 tensors of safetensors files (the header, and every
// tensor of another dtype, such as the model's bf16 weights, byte for byte), and the non-integer
// numbers of JSON files (integers, such as token ids, and strings exactly; sha256 fields of the
// data files are not compared, since the data themselves are). Each file that differs only so is
// named with its largest difference.
//
// Without the venv it prints that the oracle checks are skipped and how to make the venv; with
// CI or SPYRL_REQUIRE_ORACLES set it fails instead, so CI can't pass without running them.
//
//   node scripts/oracles.mjs                          the stage
//   node scripts/oracles.mjs --compare COMMITTED MADE  only the folder comparison (tested by
//                                                      test/model/goldenScript.test.ts)
// SPYRL_REF_PYTHON overrides the venv's python.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';

const ROOT = join(import.meta.dirname, '..');
const PYTHON = process.env.SPYRL_REF_PYTHON ?? join(ROOT, '.venv-ref/bin/python');
const SETUP = 'bash scripts/ref-venv.sh';
const shown = (p) => (p.startsWith(ROOT + '/') ? relative(ROOT, p) : p);
const isSet = (v) => !!v && !['0', 'false'].includes(v.toLowerCase());
// CI (or .ci/run, which sets SPYRL_REQUIRE_ORACLES) must run the oracles; a missing venv fails there.
const inCI = isSet(process.env.CI) || isSet(process.env.SPYRL_REQUIRE_ORACLES);

const JOBS = [
  {
    name: 'golden',
    script: 'scripts/golden_qwen3.py',
    args: ['--impl', 'hf'],
    oracle: "transformers' Qwen3ForCausalLM",
  },
  {
    name: 'golden-lora',
    script: 'scripts/golden_lora.py',
    args: ['--impl', 'peft'],
    oracle: "PEFT's PeftModel on Qwen3ForCausalLM, cross-checked with plain PyTorch autograd",
  },
  {
    name: 'golden-q4',
    script: 'scripts/golden_q4.py',
    args: ['--impl', 'hf'],
    oracle: 'Qwen3ForCausalLM and PeftModel on the dequantized q4 weights',
  },
];

/** Every file under `dir`, as paths relative to it, sorted. */
function listFiles(dir) {
  const out = [];
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      if (e.isDirectory()) walk(join(d, e.name));
      else out.push(relative(dir, join(d, e.name)));
    }
  };
  walk(dir);
  return out.sort();
}

/** Up to `max` JSON paths where `a` and `b` differ, each with both values. */
function jsonDiffs(a, b, path = '', out = [], max = 6) {
  if (out.length >= max) return out;
  const isObj = (x) => x !== null && typeof x === 'object';
  if (isObj(a) && isObj(b) && Array.isArray(a) === Array.isArray(b)) {
    for (const k of [...new Set([...Object.keys(a), ...Object.keys(b)])])
      jsonDiffs(a[k], b[k], Array.isArray(a) ? `${path}[${k}]` : path ? `${path}.${k}` : k, out, max);
  } else if (JSON.stringify(a) !== JSON.stringify(b)) {
    out.push(`${path || '(root)'}: committed ${JSON.stringify(a)}, made ${JSON.stringify(b)}`);
  }
  return out;
}

/**
 * Float32 rounding across processors: a value may differ from the committed one by this fraction
 * of the largest committed magnitude in its file (or safetensors tensor); a JSON number by this
 * fraction of itself, or by this much absolutely (the diagnostics: differences of ~1e-5 between
 * float32 and float64 forwards, which are themselves rounding).
 */
const ROUNDING = 1e-5;

/** The largest |a - b| over max |a| of two float arrays of one length, or null if NaNs differ. */
function relativeDiff(a, b) {
  let scale = 0;
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) !== Number.isNaN(b[i])) return null;
    scale = Math.max(scale, Math.abs(a[i]));
    if (!Number.isNaN(a[i])) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

const floats = (buf, start = 0, end = buf.length) =>
  new Float32Array(buf.buffer.slice(buf.byteOffset + start, buf.byteOffset + end));

/** Whether two JSON values agree up to float32 rounding (see ROUNDING); the largest relative gap in *worst. */
function jsonClose(a, b, key = '', worst = { rel: 0 }, inHash = false) {
  const isObj = (x) => x !== null && typeof x === 'object';
  const hash = inHash || /sha256/i.test(key);
  if (hash && typeof a === 'string' && typeof b === 'string') return true;
  if (typeof a === 'number' && typeof b === 'number') {
    if (Number.isInteger(a) && Number.isInteger(b)) return a === b;
    const d = Math.abs(a - b);
    worst.rel = Math.max(worst.rel, d / Math.max(Math.abs(a), 1e-30));
    return d <= ROUNDING * Math.abs(a) || d <= ROUNDING;
  }
  if (isObj(a) && isObj(b) && Array.isArray(a) === Array.isArray(b)) {
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])];
    return keys.every((k) => k in a && k in b && jsonClose(a[k], b[k], k, worst, hash));
  }
  return JSON.stringify(a) === JSON.stringify(b);
}

/** A safetensors file's header (JSON) and where its data start, or null if it does not parse. */
function safetensorsHeader(buf) {
  if (buf.length < 8) return null;
  const n = Number(buf.readBigUInt64LE(0));
  if (8 + n > buf.length) return null;
  try {
    return { header: JSON.parse(buf.subarray(8, 8 + n).toString('utf8')), data: 8 + n };
  } catch {
    return null;
  }
}

/**
 * Whether two differing files agree up to float32 rounding (ROUNDING): a short note with the
 * largest difference if so, else null (then describeDiff says why they differ).
 */
export function withinRounding(file, committed, made) {
  if (committed.length !== made.length && !file.endsWith('.json')) return null;
  if (file.endsWith('.f32') && committed.length % 4 === 0) {
    const rel = relativeDiff(floats(committed), floats(made));
    return rel !== null && rel <= ROUNDING ? `float32 values within ${rel.toExponential(1)} of their scale` : null;
  }
  if (file.endsWith('.safetensors')) {
    const [x, y] = [safetensorsHeader(committed), safetensorsHeader(made)];
    if (!x || !y || JSON.stringify(x.header) !== JSON.stringify(y.header)) return null;
    let worst = 0;
    for (const [name, t] of Object.entries(x.header)) {
      if (name === '__metadata__') continue;
      const [s0, s1] = t.data_offsets.map((o) => x.data + o);
      if (committed.subarray(s0, s1).equals(made.subarray(s0, s1))) continue;
      if (t.dtype !== 'F32') return null; // weights (bf16), ids: exactly
      const rel = relativeDiff(floats(committed, s0, s1), floats(made, s0, s1));
      if (rel === null || rel > ROUNDING) return null;
      worst = Math.max(worst, rel);
    }
    return `F32 tensors within ${worst.toExponential(1)} of their scale, the rest identical`;
  }
  if (file.endsWith('.json')) {
    try {
      const worst = { rel: 0 };
      const same = jsonClose(JSON.parse(committed.toString('utf8')), JSON.parse(made.toString('utf8')), '', worst);
      return same ? `numbers within float32 rounding (largest relative gap ${worst.rel.toExponential(1)})` : null;
    } catch {
      return null;
    }
  }
  return null;
}

/** Why two differing files differ, in a line a reader can act on. */
function describeDiff(file, committed, made) {
  if (file.endsWith('.json')) {
    try {
      const diffs = jsonDiffs(JSON.parse(committed.toString('utf8')), JSON.parse(made.toString('utf8')));
      if (diffs.length) return diffs.join('; ');
      return 'same JSON values, different formatting';
    } catch {
      return 'not valid JSON on one side';
    }
  }
  if (file.endsWith('.f32') && committed.length === made.length && committed.length % 4 === 0) {
    const a = new Float32Array(committed.buffer.slice(committed.byteOffset, committed.byteOffset + committed.length));
    const b = new Float32Array(made.buffer.slice(made.byteOffset, made.byteOffset + made.length));
    let worst = 0;
    let at = -1;
    let count = 0;
    for (let i = 0; i < a.length; i++) {
      if (Object.is(a[i], b[i])) continue;
      count++;
      const d = Math.abs(a[i] - b[i]);
      if (!(d <= worst)) [worst, at] = [d, i];
    }
    return `${count} of ${a.length} float32 values differ, max |diff| ${worst} at index ${at}`;
  }
  let i = 0;
  while (i < Math.min(committed.length, made.length) && committed[i] === made[i]) i++;
  return `${committed.length} vs ${made.length} bytes, first difference at byte ${i}`;
}

/**
 * Problems found comparing the committed fixture folder with a freshly made one ([] = the same, up
 * to float32 rounding); `rounded` collects the files that differ only by that, each with a note.
 */
export function compareFolders(committedDir, madeDir, rounded = []) {
  const problems = [];
  const want = listFiles(committedDir);
  const got = existsSync(madeDir) ? listFiles(madeDir) : [];
  for (const f of want.filter((f) => !got.includes(f)))
    problems.push(`${f}: committed, but the script did not make it`);
  for (const f of got.filter((f) => !want.includes(f))) problems.push(`${f}: made by the script, but not committed`);
  for (const f of want.filter((f) => got.includes(f))) {
    const [a, b] = [readFileSync(join(committedDir, f)), readFileSync(join(madeDir, f))];
    if (a.equals(b)) continue;
    const note = withinRounding(f, a, b);
    if (note) rounded.push(`${f}: ${note}`);
    else problems.push(`${f}: ${describeDiff(f, a, b)}`);
  }
  return problems;
}

/** Stops the stage: fails in CI, otherwise says plainly that the oracles were skipped. */
function noVenv(reason) {
  if (inCI) {
    console.error(`oracles: FAILED: ${reason}. CI must run the outside oracles; create the venv with \`${SETUP}\`.`);
    process.exit(1);
  }
  console.log(
    `oracles: SKIPPED: ${reason}. The golden fixtures were NOT checked against Hugging Face transformers and PEFT.\n` +
      `  To run these checks, create the venv (about 40 s from a local wheel mirror, 1.2 GB): ${SETUP}`,
  );
  process.exit(0);
}

/** The venv's library versions, or why it can't be used. */
function probe() {
  if (!existsSync(PYTHON)) noVenv(`no reference venv (${shown(PYTHON)} is missing)`);
  const r = spawnSync(
    PYTHON,
    [
      '-c',
      'import json, numpy, peft, safetensors, torch, transformers; from transformers import Qwen3ForCausalLM; ' +
        'print(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__, "numpy": numpy.__version__}))',
    ],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) {
    const last = (r.stderr || r.error?.message || '').trim().split('\n').at(-1);
    noVenv(`${PYTHON} can't import torch, transformers and peft (${last})`);
  }
  return JSON.parse(r.stdout.trim().split('\n').at(-1));
}

/** The versions the committed fixtures record; a venv with others can't reproduce them. */
function fixtureVersions() {
  const g = JSON.parse(readFileSync(join(ROOT, 'test/fixtures/golden/tied/expected.json'), 'utf8'));
  const l = JSON.parse(readFileSync(join(ROOT, 'test/fixtures/golden-lora/tied-all/loss.json'), 'utf8'));
  return { torch: g.torch_version, transformers: g.transformers_version, peft: l.peft_version, numpy: g.numpy_version };
}

function runJob(job, out) {
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(PYTHON, [join(ROOT, job.script), '--out', join(out, job.name), ...job.args], {
      cwd: ROOT,
      env: { ...process.env, HF_HUB_OFFLINE: '1', TRANSFORMERS_VERBOSITY: 'error', PYTHONWARNINGS: 'ignore' },
    });
    let log = '';
    child.stdout.on('data', (d) => (log += d));
    child.stderr.on('data', (d) => (log += d));
    child.on('error', (e) => resolve({ job, code: -1, log: `${log}${e.message}\n`, s: 0 }));
    child.on('close', (code) => resolve({ job, code, log, s: (Date.now() - started) / 1000 }));
  });
}

async function stage() {
  const t0 = Date.now();
  const have = probe();
  const want = fixtureVersions();
  const mismatched = Object.keys(want).filter((k) => want[k] !== have[k]);
  if (mismatched.length) {
    console.error(
      `oracles: FAILED: the venv has ${mismatched.map((k) => `${k} ${have[k]}`).join(', ')}, but the fixtures were made ` +
        `with ${mismatched.map((k) => `${k} ${want[k]}`).join(', ')}. Run \`${SETUP}\` (it pins them).`,
    );
    process.exit(1);
  }
  console.log(`oracles: ${shown(PYTHON)}: torch ${have.torch}, transformers ${have.transformers}, peft ${have.peft}`);
  const out = mkdtempSync(join(tmpdir(), 'spyrl-oracles-'));
  let failed = false;
  try {
    // The three scripts read only the committed fixtures, so they can run at once.
    const results = await Promise.all(JOBS.map((job) => runJob(job, out)));
    for (const { job, code, log, s } of results) {
      const regen = `${shown(PYTHON)} ${job.script} --out test/fixtures/${job.name} ${job.args.join(' ')}`;
      if (code !== 0) {
        failed = true;
        console.error(`oracles: ${job.script} ${job.args.join(' ')} failed (exit ${code}); its output:\n${log}`);
        continue;
      }
      const rounded = [];
      const problems = compareFolders(join(ROOT, 'test/fixtures', job.name), join(out, job.name), rounded);
      if (problems.length) {
        failed = true;
        console.error(
          `oracles: test/fixtures/${job.name} is not what ${job.oracle} makes (${job.script}):\n` +
            problems.map((p) => `  ${job.name}/${p}`).join('\n') +
            `\n  If the script changed on purpose, regenerate: ${regen}`,
        );
      } else {
        const n = listFiles(join(out, job.name)).length;
        console.log(
          `oracles: test/fixtures/${job.name}: ${n} files as ${job.oracle} makes them, ${n - rounded.length} identical` +
            `${rounded.length ? `, ${rounded.length} to float32 rounding` : ''} (${s.toFixed(1)} s)` +
            rounded.map((r) => `\n  ${job.name}/${r}`).join(''),
        );
      }
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
  if (failed) process.exit(1);
  console.log(`oracles: passed in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

const args = process.argv.slice(2);
if (args[0] === '--compare') {
  if (args.length !== 3 || !statSync(args[1], { throwIfNoEntry: false })?.isDirectory())
    throw new Error('usage: node scripts/oracles.mjs --compare COMMITTED_DIR MADE_DIR');
  const rounded = [];
  const problems = compareFolders(args[1], args[2], rounded);
  for (const p of problems) console.log(p);
  for (const r of rounded) console.log(`(within float32 rounding) ${r}`);
  process.exit(problems.length ? 1 : 0);
} else if (args.length) {
  console.error(`oracles: unknown arguments ${args.join(' ')}`);
  process.exit(2);
} else {
  await stage();
}
