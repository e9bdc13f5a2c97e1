// `spyrl quantize`: a model's q4 weights as a folder that loads on its own. The stored words
// against scripts/golden_q4.py's sha256 (the independent quantizer), the folder's logits against
// the script's PyTorch logits and bit for bit against `--weights q4` on the bf16 checkpoint, and
// the refusals: bf16 asked of a q4-only folder, --out over the model, a damaged store.
import { createHash } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, truncate, writeFile, mkdir, copyFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Q4_STORE_FILE } from '../../src/model/q4Store.ts';
import { bytesSource, readSafetensorsHeader } from '../../src/model/safetensors.ts';
import { GOLDEN, GOLDEN_Q4, goldenQ4Expected, type GoldenQ4Expected } from '../helpers/goldenQ4.ts';
import { spyrl } from '../helpers/spyrl.ts';

const MODEL = join(GOLDEN, 'tied');

let tmp: string;
let q4Dir: string;
let exp: GoldenQ4Expected;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-quantize-'));
  q4Dir = join(tmp, 'tied-q4');
  exp = await goldenQ4Expected('tied');
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

const logits = (model: string, out: string, ...more: string[]) =>
  spyrl('logits', '--model', model, '--tokens', exp.tokens.join(','), '--out', out, ...more);

describe('spyrl quantize', () => {
  it("writes the q4 store and the side files; the stored words are the reference quantizer's", async () => {
    const r = await spyrl('quantize', '--model', MODEL, '--out', q4Dir);
    expect(r.code, r.stderr).toBe(0);
    const line = JSON.parse(r.stdout) as { out: string; files: string[]; storeBytes: number };
    expect(line.out).toBe(q4Dir);
    // The golden checkpoint has no tokenizer files: only what the model folder holds is copied.
    expect(line.files.sort()).toEqual(['config.json', 'generation_config.json', Q4_STORE_FILE]);
    expect((await readdir(q4Dir)).sort()).toEqual(line.files.sort());
    expect(await readFile(join(q4Dir, 'config.json'), 'utf8')).toBe(await readFile(join(MODEL, 'config.json'), 'utf8'));
    const bytes = new Uint8Array(await readFile(join(q4Dir, Q4_STORE_FILE)));
    expect(bytes.byteLength).toBe(line.storeBytes);
    const st = await readSafetensorsHeader(bytesSource(Q4_STORE_FILE, bytes));
    expect(st.metadata).toEqual({ format: 'spyrl-q4', group: '32', version: '1' });
    expect(Object.keys(exp.q4).length).toBeGreaterThan(0);
    for (const [name, e] of Object.entries(exp.q4)) {
      const info = st.tensors.get(name)!;
      expect(info.dtype, name).toBe('U32');
      const data = bytes.subarray(info.fileOffset, info.fileOffset + info.byteLength);
      expect(createHash('sha256').update(data).digest('hex'), name).toBe(e.sha256);
    }
  });

  it('the folder loads as q4 on its own: PyTorch q4 logits, and the very bits of --weights q4 on the original', async () => {
    const fromStore = join(tmp, 'store.f32');
    const fromBf16 = join(tmp, 'bf16-quantized.f32');
    const a = await logits(q4Dir, fromStore, '--weights', 'q4');
    expect(a.code, a.stderr).toBe(0);
    expect(JSON.parse(a.stdout)).toEqual({ tokens: exp.tokens, shape: exp.shape });
    const b = await logits(MODEL, fromBf16, '--weights', 'q4');
    expect(b.code, b.stderr).toBe(0);
    const got = new Float32Array((await readFile(fromStore)).buffer.slice(0));
    const ref = new Float32Array((await readFile(join(GOLDEN_Q4, 'tied', 'logits.f32'))).buffer.slice(0));
    expect(got.length).toBe(ref.length);
    let err = 0;
    for (let i = 0; i < got.length; i++) err = Math.max(err, Math.abs(got[i]! - ref[i]!));
    expect(err).toBeLessThanOrEqual(exp.tolerance.rel * exp.max_abs_logit);
    expect(Buffer.compare(await readFile(fromStore), await readFile(fromBf16))).toBe(0);
  });

  it('quantizing the q4 folder again writes the same store', async () => {
    const again = join(tmp, 'again');
    const r = await spyrl('quantize', '--model', q4Dir, '--out', again);
    expect(r.code, r.stderr).toBe(0);
    expect(Buffer.compare(await readFile(join(q4Dir, Q4_STORE_FILE)), await readFile(join(again, Q4_STORE_FILE)))).toBe(
      0,
    );
  });

  it('bf16 from a q4-only folder is one error naming the store and the flag; nothing is written', async () => {
    const out = join(tmp, 'never.f32');
    const r = await logits(q4Dir, out); // the CLI's default weights are bf16
    expect(r.code).toBe(1);
    expect(r.stderr.split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(
      /^spyrl: error: model\.q4\.safetensors: .*holds q4 weights only \(no model\.safetensors\): .*--weights q4/,
    );
    await expect(readFile(out)).rejects.toThrow(/ENOENT/);
  });

  it('refuses an --out that is the model folder or holds it, and a non-empty one without --force', async () => {
    const copy = join(tmp, 'copy');
    await mkdir(copy);
    for (const f of ['config.json', 'generation_config.json', 'model.safetensors'])
      await copyFile(join(MODEL, f), join(copy, f));
    for (const out of [copy, tmp]) {
      const r = await spyrl('quantize', '--model', copy, '--out', out, '--force');
      expect(r.code, out).toBe(2);
      expect(r.stderr).toMatch(/^spyrl: error: --out .* is the model folder or holds it/);
    }
    expect((await readdir(copy)).sort()).toEqual(['config.json', 'generation_config.json', 'model.safetensors']);
    const bf16 = await spyrl('quantize', '--model', copy, '--out', join(tmp, 'never'), '--weights', 'bf16');
    expect(bf16.code).toBe(2);
    expect(bf16.stderr).toBe('spyrl: error: --weights: quantize writes q4 weights (got "bf16")');
    const busy = join(tmp, 'busy');
    await mkdir(busy);
    await writeFile(join(busy, 'keep.txt'), 'mine');
    const r = await spyrl('quantize', '--model', copy, '--out', busy);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--out .*busy is not empty \(keep\.txt\); pass --force/);
    expect(await readFile(join(busy, 'keep.txt'), 'utf8')).toBe('mine');
  });

  it('a damaged store is one error naming its file', async () => {
    const bad = join(tmp, 'damaged');
    await mkdir(bad);
    for (const f of ['config.json', Q4_STORE_FILE]) await copyFile(join(q4Dir, f), join(bad, f));
    const size = (await readFile(join(bad, Q4_STORE_FILE))).byteLength;
    await truncate(join(bad, Q4_STORE_FILE), size - 100);
    const r = await logits(bad, join(tmp, 'damaged.f32'), '--weights', 'q4');
    expect(r.code).toBe(1);
    expect(r.stderr.split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^spyrl: error: model\.q4\.safetensors/);
  });
});
