// scripts/oracles.mjs, the npm test stage that reruns the golden scripts with Hugging Face's own
// code (transformers' Qwen3ForCausalLM, PEFT) in the reference venv and compares every file with
// the committed fixtures. The reruns themselves need that venv and take a minute, so they run in
// that stage, not here; these tests check, without Python, that the stage can fail: that its
// comparison reports each kind of difference naming the file, and that a missing venv is a
// printed skip locally and a failure in CI.
import { execFile } from 'node:child_process';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '../..');
const ORACLES = join(ROOT, 'scripts/oracles.mjs');
const COMMITTED = join(ROOT, 'test/fixtures/golden/mha');

/** Runs oracles.mjs; returns its exit code and output (stdout + stderr). */
async function oracles(args: string[], env: Record<string, string | undefined> = {}) {
  const e = { ...process.env, ...env };
  for (const k of Object.keys(e)) if (e[k] === undefined) delete e[k];
  try {
    const { stdout, stderr } = await run('node', [ORACLES, ...args], { env: e as NodeJS.ProcessEnv });
    return { code: 0, out: stdout + stderr };
  } catch (err) {
    const x = err as { code: number; stdout: string; stderr: string };
    return { code: x.code, out: x.stdout + x.stderr };
  }
}

describe('scripts/oracles.mjs folder comparison', () => {
  let tmp: string;
  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'oracles-'));
  });
  afterAll(() => rm(tmp, { recursive: true, force: true }));
  const fresh = async (name: string, from = COMMITTED) => {
    const made = join(tmp, name);
    await cp(from, made, { recursive: true });
    return made;
  };

  it('an identical copy passes, silently', async () => {
    expect(await oracles(['--compare', COMMITTED, await fresh('same')])).toEqual({ code: 0, out: '' });
  });

  it('one changed logit is reported with the file, how many values differ and by how much', async () => {
    const dir = await fresh('logit');
    const buf = await readFile(join(dir, 'logits.f32'));
    buf.writeFloatLE(buf.readFloatLE(4 * 1000) + 0.25, 4 * 1000);
    await writeFile(join(dir, 'logits.f32'), buf);
    const r = await oracles(['--compare', COMMITTED, dir]);
    expect(r.code).toBe(1);
    expect(r.out).toMatch(/^logits\.f32: 1 of 32768 float32 values differ, max \|diff\| 0\.25 at index 1000\n$/);
  });

  it('a changed JSON field is reported by its path with both values', async () => {
    const dir = await fresh('json');
    const exp = JSON.parse(await readFile(join(dir, 'expected.json'), 'utf8'));
    exp.tokens[3] += 1;
    exp.transformers_version = '0.0.1';
    await writeFile(join(dir, 'expected.json'), JSON.stringify(exp, null, 2) + '\n');
    const r = await oracles(['--compare', COMMITTED, dir]);
    expect(r.code).toBe(1);
    expect(r.out).toContain('expected.json: transformers_version: committed "5.17.0", made "0.0.1"');
    expect(r.out).toMatch(/expected\.json: .*tokens\[3\]: committed \d+, made \d+/);
  });

  // PyTorch's CPU kernels round differently on different processors (vector width, summation
  // order): float results may move by float32 rounding, nothing else may.
  it('float results within float32 rounding pass, each file named with its largest difference', async () => {
    const dir = await fresh('rounding');
    const buf = await readFile(join(dir, 'logits.f32'));
    const v = buf.readFloatLE(4 * 1000);
    buf.writeFloatLE(v + Math.max(Math.abs(v), 1) * 1e-6, 4 * 1000);
    await writeFile(join(dir, 'logits.f32'), buf);
    const exp = JSON.parse(await readFile(join(dir, 'expected.json'), 'utf8'));
    exp.max_abs_logit *= 1 + 1e-7;
    await writeFile(join(dir, 'expected.json'), JSON.stringify(exp, null, 2) + '\n');
    const r = await oracles(['--compare', COMMITTED, dir]);
    expect(r.code, r.out).toBe(0);
    expect(r.out).toMatch(/\(within float32 rounding\) logits\.f32: float32 values within \d\.\de-\d+ of their scale/);
    expect(r.out).toMatch(/\(within float32 rounding\) expected\.json: numbers within float32 rounding/);
  });

  it('a logit off by more than rounding, or a changed token id, still fails', async () => {
    const dir = await fresh('beyond');
    const buf = await readFile(join(dir, 'logits.f32'));
    buf.writeFloatLE(buf.readFloatLE(4 * 7) + 1e-3, 4 * 7); // 4e-5 of max |logit| ~26
    await writeFile(join(dir, 'logits.f32'), buf);
    const greedy = JSON.parse(await readFile(join(dir, 'greedy.json'), 'utf8'));
    greedy.tokens[0] += 1;
    await writeFile(join(dir, 'greedy.json'), JSON.stringify(greedy, null, 2) + '\n');
    const r = await oracles(['--compare', COMMITTED, dir]);
    expect(r.code).toBe(1);
    expect(r.out).toMatch(/^logits\.f32: 1 of 32768 float32 values differ/m);
    expect(r.out).toMatch(/^greedy\.json: tokens\[0\]: committed \d+, made \d+/m);
  });

  it('a gradient tensor (safetensors F32) within rounding passes, beyond it fails; the header is exact', async () => {
    const LORA = join(ROOT, 'test/fixtures/golden-lora/tied-all');
    const st = await readFile(join(LORA, 'grads.safetensors'));
    const data = 8 + Number(st.readBigUInt64LE(0)); // the first tensor's data start here
    for (const [name, delta, code] of [
      ['grad-rounding', 1e-8, 0],
      ['grad-beyond', 1e-2, 1],
    ] as const) {
      const dir = await fresh(name, LORA);
      const b = Buffer.from(st);
      b.writeFloatLE(b.readFloatLE(data) + delta, data);
      await writeFile(join(dir, 'grads.safetensors'), b);
      const r = await oracles(['--compare', LORA, dir]);
      expect(r.code, r.out).toBe(code);
      expect(r.out).toContain(
        code ? 'grads.safetensors: ' : '(within float32 rounding) grads.safetensors: F32 tensors within',
      );
    }
  });

  it('a missing file, an extra file and a changed checkpoint byte are each reported', async () => {
    const dir = await fresh('files');
    await rm(join(dir, 'greedy.json'));
    await writeFile(join(dir, 'stray.bin'), 'x');
    const st = await readFile(join(dir, 'model.safetensors'));
    st[st.length - 1] ^= 1;
    await writeFile(join(dir, 'model.safetensors'), st);
    const r = await oracles(['--compare', COMMITTED, dir]);
    expect(r.code).toBe(1);
    expect(r.out.trim().split('\n').sort()).toEqual([
      'greedy.json: committed, but the script did not make it',
      `model.safetensors: ${st.length} vs ${st.length} bytes, first difference at byte ${st.length - 1}`,
      'stray.bin: made by the script, but not committed',
    ]);
  });
});

describe('scripts/oracles.mjs without the reference venv', () => {
  const missing = { SPYRL_REF_PYTHON: '/nonexistent/.venv-ref/bin/python' };

  it('outside CI it passes but says plainly that the oracle checks were skipped and how to make the venv', async () => {
    const r = await oracles([], { ...missing, CI: undefined, SPYRL_REQUIRE_ORACLES: undefined });
    expect(r.code).toBe(0);
    expect(r.out).toContain('oracles: SKIPPED: no reference venv (/nonexistent/.venv-ref/bin/python is missing)');
    expect(r.out).toContain('NOT checked against Hugging Face transformers and PEFT');
    expect(r.out).toContain('bash scripts/ref-venv.sh');
  });

  it.each([
    ['CI=true', { CI: 'true', SPYRL_REQUIRE_ORACLES: undefined }],
    ['SPYRL_REQUIRE_ORACLES=1 (.ci/run)', { CI: undefined, SPYRL_REQUIRE_ORACLES: '1' }],
  ])('with %s it fails, naming the venv and the set-up command', async (_, env) => {
    const r = await oracles([], { ...missing, ...env });
    expect(r.code).toBe(1);
    expect(r.out).toContain('oracles: FAILED: no reference venv (/nonexistent/.venv-ref/bin/python is missing)');
    expect(r.out).toContain('bash scripts/ref-venv.sh');
  });
});
