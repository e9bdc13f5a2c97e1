// `spyrl train` on the tiny model from a clean clone: 2 rounds, a PEFT adapter that moved away
// from its initialisation, a run log with every field, a checkpoint; resuming after round 1
// reproduces the uninterrupted run's round 2 exactly.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { initLora, readAdapter } from '../../src/model/peft.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { loadQwen3Config } from '../../src/model/config.ts';
import { spyrl } from '../helpers/spyrl.ts';

let tmp: string, model: string, config: string;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-game-'));
  model = join(tmp, 'tiny');
  expect((await spyrl('tiny-model', '--out', model)).code).toBe(0);
  config = join(tmp, 'config.json');
  // Small enough for SwiftShader: 3 players, short documents and summaries, an update every round.
  await writeFile(
    config,
    JSON.stringify({
      groupSize: 3,
      docTokenBudget: 48,
      summaryMaxTokens: 8,
      roundsPerUpdate: 1,
      evalEvery: 0,
      checkpointEvery: 1,
      lora: { r: 4, alpha: 8 },
      optimizer: { lr: 0.001 },
      seed: 7,
    }),
  );
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe('spyrl train', () => {
  it('plays 2 rounds, writes adapter + run log + checkpoint, and resumes exactly', async () => {
    const full = join(tmp, 'full');
    const r = await spyrl(
      'train',
      '--model',
      model,
      '--docs',
      'bundled',
      '--rounds',
      '2',
      '--out',
      full,
      '--config',
      config,
    );
    expect(r.code, r.stderr).toBe(0);
    // A fresh process: the first round compiles the kernels it uses, and says so.
    expect(r.stdout).toMatch(/round 1\/2 .* s {2}\(\d+ GPU kernels compiled on first use\)\n/);
    expect(r.stdout).toMatch(/round 2\/2/);

    // The adapter moved away from PEFT's initialisation (B = 0).
    const cfg = await loadQwen3Config(nodeFolderSource(model));
    const { lora, tensors } = await readAdapter(nodeFolderSource(full), cfg);
    const init = initLora(cfg, lora, 7);
    const moved = [...tensors].some(([k, v]) => v.some((x, i) => x !== init.get(k)![i]));
    expect(moved).toBe(true);
    expect([...tensors.keys()].some((k) => k.endsWith('lora_B.weight') && tensors.get(k)!.some((x) => x !== 0))).toBe(
      true,
    );

    // Run log: one line per round with every field.
    const lines = (await readFile(join(full, 'run.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(2);
    for (const rec of lines) {
      expect(Object.keys(rec)).toEqual(
        expect.arrayContaining([
          'round',
          'documentId',
          'spySeat',
          'labels',
          'mask',
          'summaries',
          'votes',
          'rewards',
          'advantages',
          'metrics',
          'train',
          'timings',
        ]),
      );
      expect(rec.mask.span).toMatchObject({
        charStart: expect.any(Number),
        charEnd: expect.any(Number),
        tokenStart: expect.any(Number),
        tokenEnd: expect.any(Number),
      });
      expect(rec.votes[0].probs.length).toBe(2);
      expect(typeof rec.train.loss).toBe('number');
      expect(typeof rec.train.gradNorm).toBe('number');
      expect(typeof rec.train.lr).toBe('number');
      expect(rec.train.kl).toBeNull(); // klBeta 0: the KL is not computed, so it is off, not 0
    }
    const usedConfig = JSON.parse(await readFile(join(full, 'spyrl_config.json'), 'utf8'));
    expect(usedConfig).toMatchObject({ groupSize: 3, seed: 7 });

    // Resume from the checkpoint written after round 1: round 2 must be identical.
    const resumed = join(tmp, 'resumed');
    const r2 = await spyrl(
      'train',
      '--model',
      model,
      '--docs',
      'bundled',
      '--rounds',
      '2',
      '--out',
      resumed,
      '--config',
      config,
      '--resume',
      join(full, 'checkpoint-1'),
    );
    expect(r2.code, r2.stderr).toBe(0);
    const again = (await readFile(join(resumed, 'run.jsonl'), 'utf8')).trim().split('\n');
    expect(again).toHaveLength(2);
    expect(again[1]).toBe(JSON.stringify(lines[1]));
    for (const f of ['adapter_model.safetensors', 'optimizer.safetensors']) {
      expect(Buffer.compare(await readFile(join(full, f)), await readFile(join(resumed, f))), f).toBe(0);
    }
  }, 600_000); // three runs of a few rounds each on SwiftShader
  // `spyrl eval`: test/cli/eval.test.ts.
});
