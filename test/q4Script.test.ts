// The committed q4 fixtures (test/fixtures/golden-q4) are what scripts/golden_q4.py makes: rerun
// it (PyTorch from Debian's python3-torch, installed by .ci/run) and compare bytes, so a fixture
// can't drift from the script that documents it. Same pattern as goldenScript.test.ts.
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const PY = process.env.SPYRL_PYTHON ?? '/usr/bin/python3';
const ROOT = join(import.meta.dirname, '..');
const FIX = join(ROOT, 'test/fixtures/golden-q4');
const FOLDERS = ['tied', 'untied-sharded', 'mha', 'lora-tied-all'];

const hasTorch = await run(PY, ['-c', 'import torch']).then(
  () => true,
  () => false,
);

/** The JSON minus the library versions, which may differ between machines. */
function stripVersions(text: string): unknown {
  const o = JSON.parse(text) as Record<string, unknown>;
  for (const k of ['torch_version', 'transformers_version', 'numpy_version']) delete o[k];
  return o;
}

describe.skipIf(!hasTorch && !process.env.CI)('golden q4 fixtures are reproducible', () => {
  it('rerunning scripts/golden_q4.py gives byte-identical files', async () => {
    if (!hasTorch) throw new Error(`${PY} has no torch: apt-get install python3-torch liblapack3 (CI installs it)`);
    const out = await mkdtemp(join(tmpdir(), 'golden-q4-'));
    try {
      await run(PY, [join(ROOT, 'scripts/golden_q4.py'), '--out', out, '--impl', 'torch'], { timeout: 60_000 });
      expect((await readdir(out)).sort()).toEqual([...FOLDERS].sort());
      expect((await readdir(FIX)).sort()).toEqual([...FOLDERS].sort());
      for (const folder of FOLDERS) {
        const files = (await readdir(join(FIX, folder))).sort();
        expect((await readdir(join(out, folder))).sort(), folder).toEqual(files);
        for (const f of files) {
          const [mine, committed] = [await readFile(join(out, folder, f)), await readFile(join(FIX, folder, f))];
          if (f.endsWith('.json'))
            expect(stripVersions(mine.toString('utf8')), `${folder}/${f}`).toEqual(
              stripVersions(committed.toString('utf8')),
            );
          else expect(Buffer.compare(mine, committed), `${folder}/${f}`).toBe(0);
        }
      }
    } finally {
      await rm(out, { recursive: true, force: true });
    }
  });
});
