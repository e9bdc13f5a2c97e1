// Issue 9, rows owned by task 9A, through the `spyrl` command as a user runs it: config.json caps
// (row 1), tampered checkpoints (row 2), --resume adopting the saved run and refusing flags that
// would change it (row 3), --out refused unless --force (row 4), saves that leave no partial
// folders (row 5), and flag / adapter ranges (row 6). Pure parts: test/train/checkpoint.hostile.test.ts.
import { cp, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readOptimizerState, writeOptimizerState } from '../../src/model/peft.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { spyrl } from '../helpers/spyrl.ts';

let tmp: string, model: string;
const TINY = ['--layers', '1', '--hidden', '32', '--heads', '2', '--kv-heads', '1', '--intermediate', '64'];

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-hostile-'));
  model = join(tmp, 'tiny');
  const r = await spyrl('tiny-model', '--out', model, ...TINY);
  expect(r.code, r.stderr).toBe(0);
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

const json = async (file: string) => JSON.parse(await readFile(file, 'utf8'));
/** Folders a save left half-done beside its target (there must be none). */
const leftovers = async (dir: string) => (await readdir(dir)).filter((n) => /\.(partial|old)-/.test(n));

describe('row 1 and row 6: sizes and ranges refused before any work', () => {
  it('row 1: a config.json with num_hidden_layers 2e8 is refused naming the field and the range', async () => {
    const cfg = join(tmp, 'absurd.json');
    await writeFile(cfg, JSON.stringify({ ...(await json(join(model, 'config.json'))), num_hidden_layers: 2e8 }));
    const r = await spyrl('memory', '--config', cfg);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /config\.json: field "num_hidden_layers" must be a positive integer in 1\.\.256, got 200000000/,
    );
  });

  it.each<[string, string[], RegExp]>([
    ['sft --gpu-memory=-1', ['sft', '--gpu-memory=-1'], /--gpu-memory must be > 0 \(got "-1"\)/],
    ['sft --weight-decay=-0.1', ['sft', '--weight-decay=-0.1'], /--weight-decay must be >= 0 \(got "-0\.1"\)/],
    ['sft --max-grad-norm=-1', ['sft', '--max-grad-norm=-1'], /--max-grad-norm must be >= 0 \(got "-1"\)/],
    ['train --gpu-memory=-2', ['train', '--gpu-memory=-2', '--rounds', '1'], /--gpu-memory must be > 0 \(got "-2"\)/],
    [
      'train --prefill-chunk 1.5',
      ['train', '--prefill-chunk', '1.5', '--rounds', '1'],
      /--prefill-chunk must be auto or a positive integer of tokens \(got "1\.5"\)/,
    ],
    [
      'train --mlp-chunk 0',
      ['train', '--mlp-chunk', '0', '--rounds', '1'],
      /--mlp-chunk must be auto or a positive integer of rows \(got "0"\)/,
    ],
    [
      'sft --mlp-chunk -8',
      ['sft', '--mlp-chunk=-8'],
      /--mlp-chunk must be auto or a positive integer of rows \(got "-8"\)/,
    ],
  ])('row 6: %s is refused with the allowed range', async (_name, args, msg) => {
    const [cmd, ...rest] = args;
    const base = cmd === 'sft' ? ['--text-file', join(tmp, 'none.txt'), '--steps', '1'] : ['--docs', 'bundled'];
    const r = await spyrl(cmd!, '--model', model, '--out', join(tmp, 'never'), ...base, ...rest);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(msg);
    expect(await readdir(tmp)).not.toContain('never');
  });

  it('row 6: sft --r 300 and --alpha 0 are refused with the allowed range', async () => {
    const text = join(tmp, 'r.txt');
    await writeFile(text, 'A short text to train on, twice. A short text to train on, twice.');
    let r = await spyrl(
      'sft',
      '--model',
      model,
      '--text-file',
      text,
      '--steps',
      '1',
      '--out',
      join(tmp, 'never'),
      '--r',
      '300',
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/LoRA rank r must be a positive integer, got 300 \(allowed range 1\.\.256\)/);
    r = await spyrl(
      'sft',
      '--model',
      model,
      '--text-file',
      text,
      '--steps',
      '1',
      '--out',
      join(tmp, 'never'),
      '--alpha',
      '0',
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/lora alpha must be a number > 0, got 0 \(allowed range \(0, 10000\]\)/);
  });
});

describe('row 4: --out must be new or empty unless --force', () => {
  it('row 4: tiny-model over a non-empty folder is refused; --force replaces it whole (no stale shard index)', async () => {
    const dir = join(tmp, 'sharded');
    expect((await spyrl('tiny-model', '--out', dir, ...TINY, '--shards', '2')).code).toBe(0);
    const before = (await readdir(dir)).sort();
    expect(before).toContain('model.safetensors.index.json');
    const again = await spyrl('tiny-model', '--out', dir, ...TINY);
    expect(again.code).toBe(2);
    expect(again.stderr).toMatch(/--out .*sharded is not empty \(.*\); pass --force to replace it/);
    expect((await readdir(dir)).sort()).toEqual(before);
    const forced = await spyrl('tiny-model', '--out', dir, ...TINY, '--force');
    expect(forced.code, forced.stderr).toBe(0);
    expect((await readdir(dir)).sort()).toEqual([...JSON.parse(forced.stdout).files].sort());
    expect(await readdir(dir)).not.toContain('model.safetensors.index.json');
    expect(await leftovers(tmp)).toEqual([]);
  });

  it('row 4: sft and train refuse a non-empty --out before loading anything', async () => {
    const text = join(tmp, 'r.txt');
    const s = await spyrl('sft', '--model', model, '--text-file', text, '--steps', '1', '--out', model);
    expect(s.code).toBe(2);
    expect(s.stderr).toMatch(/--out .*tiny is not empty/);
    const t = await spyrl('train', '--model', model, '--docs', 'bundled', '--rounds', '1', '--out', model);
    expect(t.code).toBe(2);
    expect(t.stderr).toMatch(/--out .*tiny is not empty.*--force/);
  });
});

describe('spyrl sft --resume', () => {
  let text: string;
  const flags = () => [
    '--model',
    model,
    '--text-file',
    text,
    '--seq-len',
    '16',
    '--batch',
    '1',
    '--lr',
    '0.01',
    '--r',
    '4',
    '--alpha',
    '8',
    '--targets',
    'q_proj,v_proj',
    '--seed',
    '3',
  ];

  beforeAll(async () => {
    text = join(tmp, 'sft.txt');
    await writeFile(text, 'The spy saw a report with one fifth of it removed and wrote a summary. ');
    for (const [steps, out] of [
      ['2', 'sft-full'],
      ['1', 'sft-half'],
    ] as const) {
      const r = await spyrl('sft', ...flags(), '--steps', steps, '--out', join(tmp, out));
      expect(r.code, r.stderr).toBe(0);
    }
  }, 300_000);

  it('row 3: sft --resume with no flags adopts the saved settings and continues exactly; row 2: the run id is kept', async () => {
    const r = await spyrl(
      'sft',
      '--model',
      model,
      '--steps',
      '2',
      '--resume',
      join(tmp, 'sft-half'),
      '--out',
      join(tmp, 'sft-resumed'),
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/lr 0\.01 constant/);
    for (const f of ['adapter_model.safetensors', 'optimizer.safetensors']) {
      expect(
        Buffer.compare(await readFile(join(tmp, 'sft-full', f)), await readFile(join(tmp, 'sft-resumed', f))),
        f,
      ).toBe(0);
    }
    const half = await json(join(tmp, 'sft-half', 'trainer_state.json'));
    const resumed = await json(join(tmp, 'sft-resumed', 'trainer_state.json'));
    expect(resumed.extra.run).toEqual(half.extra.run);
    expect(resumed.extra.run).toMatchObject({
      format: 'spyrl-run',
      version: 1,
      runId: expect.stringMatching(/^[0-9a-f-]{36}$/),
    });
    expect(resumed.extra.sft).toMatchObject({
      seed: 3,
      seqLen: 16,
      batch: 1,
      lr: 0.01,
      schedule: 'constant',
      warmup: 0,
    });
    expect(await leftovers(tmp)).toEqual([]);
  }, 300_000);

  it('row 3: sft --resume refuses lr, schedule, warmup, seq-len, batch, seed, weight decay, clip, weights and text that change the run', async () => {
    const r = await spyrl(
      'sft',
      '--model',
      model,
      '--steps',
      '3',
      '--resume',
      join(tmp, 'sft-half'),
      '--out',
      join(tmp, 'never'),
      '--lr',
      '0.02',
      '--schedule',
      'cosine',
      '--warmup',
      '1',
      '--seq-len',
      '8',
      '--batch',
      '2',
      '--seed',
      '4',
      '--weight-decay',
      '0.1',
      '--max-grad-norm',
      '2',
      '--weights',
      'q4',
    );
    expect(r.code).toBe(2);
    for (const part of [
      '--weights (saved bf16, asked q4)',
      '--lr (saved 0.01, asked 0.02)',
      '--schedule (saved constant, asked cosine)',
      '--warmup (saved 0, asked 1)',
      '--seq-len (saved 16, asked 8)',
      '--batch (saved 1, asked 2)',
      '--seed (saved 3, asked 4)',
      '--weight-decay (saved 0, asked 0.1)',
      '--max-grad-norm (saved 1, asked 2)',
    ]) {
      expect(r.stderr).toContain(part);
    }
    const other = join(tmp, 'other.txt');
    await writeFile(other, 'Different text entirely, so the windows differ.');
    const t = await spyrl(
      'sft',
      '--model',
      model,
      '--steps',
      '3',
      '--resume',
      join(tmp, 'sft-half'),
      '--out',
      join(tmp, 'never'),
      '--text-file',
      other,
    );
    expect(t.code, t.stderr).toBe(2);
    expect(t.stderr).toMatch(/--text-file \(contents\) .*other\.txt differs from the run's .*sft\.txt/);
    // The same values as saved are not a change.
    const same = await spyrl(
      'sft',
      ...flags(),
      '--steps',
      '3',
      '--resume',
      join(tmp, 'sft-half'),
      '--out',
      join(tmp, 'sft-same'),
      '--r',
      '8',
    );
    expect(same.code).toBe(2);
    expect(same.stderr).toMatch(/would change the run's adapter: --r \(saved 4, asked 8\); leave them out/); // only the rank differs
  }, 300_000);

  it('row 2: sft --resume refuses a trainer_state.json whose settings are mistyped, naming the field', async () => {
    const bad = join(tmp, 'sft-bad');
    await cp(join(tmp, 'sft-half'), bad, { recursive: true });
    const state = await json(join(bad, 'trainer_state.json'));
    state.extra.sft.lr = 'fast';
    await writeFile(join(bad, 'trainer_state.json'), JSON.stringify(state));
    const r = await spyrl('sft', '--model', model, '--steps', '3', '--resume', bad, '--out', join(tmp, 'never'));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/trainer_state\.json: field "extra\.sft\.lr" must be a finite number, got "fast"/);
  });
});

describe('spyrl train --resume', () => {
  let docs: string, config: string;
  const run1 = () => join(tmp, 'run1');

  beforeAll(async () => {
    docs = join(tmp, 'docs.jsonl');
    await writeFile(
      docs,
      [
        'The agency audited its programs. It found gaps in oversight and asked for more staff.',
        'The committee reviewed the budget. Costs rose by a tenth while revenue fell.',
      ]
        .map((report, i) => JSON.stringify({ id: `d${i}`, report }))
        .join('\n') + '\n',
    );
    config = join(tmp, 'run.json');
    await writeFile(
      config,
      JSON.stringify({
        groupSize: 3,
        docTokenBudget: 32,
        summaryMaxTokens: 8,
        roundsPerUpdate: 1,
        evalEvery: 0,
        checkpointEvery: 1,
        lora: { r: 2, alpha: 4 },
        optimizer: { lr: 0.001 },
        seed: 7,
      }),
    );
    // 2 rounds, checkpointEvery 1: checkpoint-1 is saved during the run and kept by the final save.
    // An f16 KV cache (not the CLI default): a resume that did not adopt it would sample otherwise.
    const r = await spyrl(
      'train',
      '--model',
      model,
      '--docs',
      docs,
      '--rounds',
      '2',
      '--out',
      run1(),
      '--config',
      config,
      '--kv',
      'f16',
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('rounds 1..2, bf16 weights, f16 KV cache');
  }, 600_000);

  it('row 5: checkpoint-N and the final save are whole folders, nothing half-written beside them', async () => {
    expect(await readdir(run1())).toEqual(
      expect.arrayContaining([
        'adapter_config.json',
        'adapter_model.safetensors',
        'checkpoint-1',
        'optimizer.safetensors',
        'spyrl_config.json',
        'spyrl_run.json',
        'trainer_state.json',
      ]),
    );
    expect((await json(join(run1(), 'checkpoint-1', 'trainer_state.json'))).extra.trainer.round).toBe(1);
    expect((await json(join(run1(), 'trainer_state.json'))).extra.trainer.round).toBe(2);
    expect(await leftovers(tmp)).toEqual([]);
    expect(await leftovers(run1())).toEqual([]);
  });

  it('row 3: train --resume with no --config/--docs adopts the checkpoint config and documents and continues exactly', async () => {
    const out = join(tmp, 'run2');
    const r = await spyrl(
      'train',
      '--model',
      model,
      '--rounds',
      '2',
      '--resume',
      join(run1(), 'checkpoint-1'),
      '--out',
      out,
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/2 training .* group 3, rounds 2\.\.2, bf16 weights, f16 KV cache/);
    expect(await json(join(out, 'spyrl_config.json'))).toEqual(await json(join(run1(), 'spyrl_config.json')));
    expect(await json(join(out, 'spyrl_run.json'))).toEqual(await json(join(run1(), 'spyrl_run.json')));
    // The same round 2 as the uninterrupted run: the seed, documents and group size were adopted.
    const log = async (dir: string) => (await readFile(join(dir, 'run.jsonl'), 'utf8')).trim().split('\n');
    expect((await log(out))[1]).toBe((await log(run1()))[1]);
    for (const f of ['adapter_model.safetensors', 'optimizer.safetensors']) {
      expect(Buffer.compare(await readFile(join(run1(), f)), await readFile(join(out, f))), f).toBe(0);
    }
    const first = await json(join(run1(), 'trainer_state.json'));
    const last = await json(join(out, 'trainer_state.json'));
    expect(last.extra.run).toEqual(first.extra.run); // the run id survives the resume
    expect(last.extra.run).toMatchObject({ format: 'spyrl-run', version: 1 });
  }, 600_000);

  it('row 3: a --config, --seed or --docs that changes the resumed run is refused, naming the differing fields', async () => {
    const changed = join(tmp, 'run-changed.json');
    await writeFile(changed, JSON.stringify({ ...(await json(config)), groupSize: 4, optimizer: { lr: 0.002 } }));
    let r = await spyrl(
      'train',
      '--model',
      model,
      '--rounds',
      '2',
      '--resume',
      run1(),
      '--out',
      join(tmp, 'never'),
      '--config',
      changed,
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /--config .*run-changed\.json would change the run: groupSize \(saved 3, asked 4\), optimizer\.lr \(saved 0\.001, asked 0\.002\); leave --config out/,
    );
    r = await spyrl(
      'train',
      '--model',
      model,
      '--rounds',
      '2',
      '--resume',
      run1(),
      '--out',
      join(tmp, 'never'),
      '--seed',
      '8',
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--seed would change the run: seed \(saved 7, asked 8\)/);
    r = await spyrl(
      'train',
      '--model',
      model,
      '--rounds',
      '2',
      '--resume',
      run1(),
      '--out',
      join(tmp, 'never'),
      '--docs',
      'bundled',
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /--docs bundled would change the run: its documents differ from the checkpoint's \(.*docs\.jsonl/,
    );
    expect(await readdir(tmp)).not.toContain('never');
  });

  it('row 3: train --resume refuses a --weights or --kv that would change the base, and a malformed format', async () => {
    expect((await json(join(run1(), 'spyrl_run.json'))).format).toEqual({ weights: 'bf16', kv: 'f16' });
    const resume = (dir: string, ...extra: string[]) =>
      spyrl('train', '--model', model, '--rounds', '2', '--resume', dir, '--out', join(tmp, 'never'), ...extra);
    let r = await resume(run1(), '--kv', 'f32');
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(
      '--resume: --kv would change the base model its adapter was trained against: kv (saved f16, asked f32); leave --kv out to continue with bf16 weights, f16 KV cache',
    );
    r = await resume(run1(), '--weights', 'q4', '--kv', 'f32');
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--weights and --kv would change the base model');
    expect(r.stderr).toContain('weights (saved bf16, asked q4), kv (saved f16, asked f32)');

    const bad = join(tmp, 'bad-format');
    await rm(bad, { recursive: true, force: true });
    await cp(run1(), bad, { recursive: true });
    const run = await json(join(bad, 'spyrl_run.json'));
    await writeFile(join(bad, 'spyrl_run.json'), JSON.stringify({ ...run, format: { weights: 'q8', kv: 'f16' } }));
    r = await resume(bad);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/spyrl_run\.json: field "format" must be .*"q8"/);
    expect(await readdir(tmp)).not.toContain('never');
  });

  it.each<
    [string, (state: { extra: { trainer: Record<string, unknown>; run: Record<string, unknown> } }) => void, RegExp]
  >([
    [
      'a wrong type',
      (s) => {
        s.extra.trainer.round = 'abc';
      },
      /trainer_state\.json: field "extra\.trainer\.round" must be an integer >= 0, got "abc"/,
    ],
    [
      'an unknown version',
      (s) => {
        s.extra.run.version = 2;
      },
      /trainer_state\.json: field "extra\.run\.version" is 2; this build reads version 1/,
    ],
    [
      'a missing run stamp',
      (s) => {
        delete (s.extra as Record<string, unknown>).run;
      },
      /trainer_state\.json: field "extra\.run" is missing/,
    ],
  ])('row 2: train --resume refuses a checkpoint with %s, naming the field', async (_what, spoil, msg) => {
    const bad = join(tmp, 'bad-ckpt');
    await rm(bad, { recursive: true, force: true });
    await cp(run1(), bad, { recursive: true });
    const state = await json(join(bad, 'trainer_state.json'));
    spoil(state);
    await writeFile(join(bad, 'trainer_state.json'), JSON.stringify(state));
    const r = await spyrl('train', '--model', model, '--rounds', '2', '--resume', bad, '--out', join(tmp, 'never'));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(msg);
  });

  it('row 2: train --resume refuses a config that fails validateConfig and NaN or negative optimizer moments', async () => {
    const bad = join(tmp, 'bad-ckpt');
    await rm(bad, { recursive: true, force: true });
    await cp(run1(), bad, { recursive: true });
    await writeFile(
      join(bad, 'spyrl_config.json'),
      JSON.stringify({ ...(await json(join(run1(), 'spyrl_config.json'))), groupSize: 'three' }),
    );
    let r = await spyrl('train', '--model', model, '--rounds', '2', '--resume', bad, '--out', join(tmp, 'never'));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/spyrl_config\.json: field "groupSize" must be an integer/);

    await cp(join(run1(), 'spyrl_config.json'), join(bad, 'spyrl_config.json'));
    const st = await readOptimizerState(nodeFolderSource(run1()));
    const key = [...st.v.keys()][0]!;
    st.v.get(key)![2] = -0.5;
    await writeFile(join(bad, 'optimizer.safetensors'), writeOptimizerState(st)['optimizer.safetensors']);
    r = await spyrl('train', '--model', model, '--rounds', '2', '--resume', bad, '--out', join(tmp, 'never'));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      new RegExp(
        `optimizer\\.safetensors: tensor "exp_avg_sq\\.${key.replaceAll('.', '\\.')}": value -0\\.5 at index 2: second moments must be finite and >= 0`,
      ),
    );
  });
});
