// The committed PyTorch fixtures are what scripts/golden_qwen3.py makes: rerun it (PyTorch from
// Debian's python3-torch, installed by .ci/run) and compare bytes, so a fixture can't drift from
// the script that documents it.
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const PY = process.env.SPYRL_PYTHON ?? '/usr/bin/python3';
const ROOT = join(import.meta.dirname, '..');

const hasTorch = await run(PY, ['-c', 'import torch']).then(
  () => true,
  () => false,
);

describe.skipIf(!hasTorch && !process.env.CI)('golden fixtures are reproducible', () => {
  it.each(['tied', 'untied-sharded', 'mha'])(
    '%s: rerunning the PyTorch script gives byte-identical files',
    async (variant) => {
      if (!hasTorch) throw new Error(`${PY} has no torch: apt-get install python3-torch liblapack3 (CI installs it)`);
      const out = await mkdtemp(join(tmpdir(), 'golden-'));
      try {
        await run(PY, [join(ROOT, 'scripts/golden_qwen3.py'), '--out', out, '--only', variant, '--impl', 'torch'], {
          timeout: 120_000,
        });
        const committed = join(ROOT, 'test/fixtures/golden', variant);
        const files = (await readdir(committed)).filter((f) => f !== 'expected.json' && f !== 'greedy.json').sort();
        expect((await readdir(join(out, variant))).sort()).toEqual((await readdir(committed)).sort());
        for (const f of files)
          expect(Buffer.compare(await readFile(join(out, variant, f)), await readFile(join(committed, f))), f).toBe(0);
        const strip = (j: string) => {
          const o = JSON.parse(j);
          delete o.torch_version;
          delete o.transformers_version;
          return o;
        };
        for (const f of ['expected.json', 'greedy.json'])
          expect(strip(await readFile(join(out, variant, f), 'utf8')), f).toEqual(
            strip(await readFile(join(committed, f), 'utf8')),
          );
      } finally {
        await rm(out, { recursive: true, force: true });
      }
    },
  );
});
