// A successful run prints nothing on stderr but its own lines: without a valid XDG_RUNTIME_DIR
// (headless Linux, containers) the graphics stack used to print "error: XDG_RUNTIME_DIR is
// invalid or not set in the environment." twice when the GPU started, which reads as a failure.
// bin/spyrl.mjs points it at a private temporary folder first. stderr is checked raw here.
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spyrl, spyrlWith } from '../helpers/spyrl.ts';

let tmp: string, model: string;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-clean-'));
  model = join(tmp, 'tiny');
  const tiny = ['--layers', '1', '--hidden', '32', '--heads', '2', '--kv-heads', '1', '--head-dim', '16'];
  expect((await spyrl('tiny-model', '--out', model, ...tiny, '--intermediate', '64', '--vocab', '300')).code).toBe(0);
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe('clean CLI output', () => {
  it.each([
    ['unset', undefined],
    ['not an absolute path', 'not/absolute'],
  ])(
    'XDG_RUNTIME_DIR %s: a GPU run prints only its result, and nothing on stderr',
    async (_, value) => {
      // Its own TMPDIR, so what the run leaves there is its own.
      const ownTmp = await mkdtemp(join(tmp, 'tmpdir-'));
      const r = await spyrlWith(
        { env: { XDG_RUNTIME_DIR: value, TMPDIR: ownTmp }, raw: true },
        'logits',
        '--model',
        model,
        '--tokens',
        '1,2',
        '--out',
        join(tmp, 'logits.bin'),
      );
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toBe('');
      expect(r.stdout).toBe('{"tokens":[1,2],"shape":[2,300]}\n');
      // The private folder goes with the process.
      expect((await readdir(ownTmp)).filter((n) => n.startsWith('spyrl-runtime-'))).toEqual([]);
    },
    60_000,
  );
});
