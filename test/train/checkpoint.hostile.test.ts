// Issue 9, rows owned by task 9A that need no command line: config.json sanity caps (row 1),
// checkpoint / autosave validation (row 2), atomic saves with an injected crash (row 5) and the
// adapter's r / alpha range (row 6). The CLI side of these rows is in test/cli/cli.hostile.test.ts.
import { mkdtemp, readdir, readFile, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONFIG_CAPS, parseQwen3Config, QWEN3_PRESETS } from '../../src/model/config.ts';
import { ModelLoadError } from '../../src/model/errors.ts';
import {
  initLora,
  loraConfig,
  parseAdapterConfig,
  readOptimizerState,
  writeAdapter,
  writeOptimizerState,
  MAX_LORA_R,
} from '../../src/model/peft.ts';
import { memoryHubCache, memorySource } from '../../src/model/sources.ts';
import { validateConfig } from '../../src/game/config.ts';
import {
  CheckpointError,
  configDiff,
  parseAutosaveMeta,
  parsePending,
  parseRunDocuments,
  parseRunLog,
  parseSavedConfig,
  parseSftExtra,
  parseTrainerExtra,
  runStamp,
  RUN_VERSION,
} from '../../src/train/checkpoint.ts';
import { saveFolder, type FileData } from '../../src/cli/saveFolder.ts';
import { makeTinyCheckpoint } from '../../src/model/tinyModel.ts';
import { qwen3TokenizerFiles } from '../../src/model/tinyModel.node.ts';
import { PlaygroundEngine } from '../../src/worker/engine.ts';
import { memoryRunStorage, type RunFiles, type RunStorage } from '../../src/worker/runStorage.ts';
import type { SavedRunMeta } from '../../src/worker/protocol.ts';

/** config.json of Qwen3-0.6B as on the Hub. */
const qwen06 = {
  model_type: 'qwen3',
  hidden_size: 1024,
  num_hidden_layers: 28,
  num_attention_heads: 16,
  num_key_value_heads: 8,
  head_dim: 128,
  intermediate_size: 3072,
  vocab_size: 151936,
  max_position_embeddings: 40960,
  rope_theta: 1000000,
  rms_norm_eps: 1e-6,
  tie_word_embeddings: true,
};

function thrown(f: () => unknown): Error {
  try {
    f();
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a throw');
}

async function rejected(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error('expected a rejection');
}

describe('row 1: config.json sanity caps', () => {
  it.each<[string, number]>([
    ['num_hidden_layers', 2e8],
    ['hidden_size', 1 << 20],
    ['intermediate_size', 1 << 30],
    ['vocab_size', 1 << 24],
    ['num_attention_heads', 1 << 16],
    ['num_key_value_heads', 1 << 16],
    ['head_dim', 1 << 16],
    ['max_position_embeddings', 2 ** 40],
  ])('row 1: an absurd %s (%d) is refused naming the field and the allowed range', (field, value) => {
    const started = performance.now();
    const e = thrown(() => parseQwen3Config({ ...qwen06, [field]: value }));
    expect(e).toBeInstanceOf(ModelLoadError);
    expect(e.message).toContain(`config.json: field "${field}"`);
    expect(e.message).toContain(`1..${CONFIG_CAPS[field as keyof typeof CONFIG_CAPS]}`);
    expect(e.message).toContain(String(value));
    expect(performance.now() - started).toBeLessThan(100); // refused before anything is sized from it
  });

  it('row 1: the caps admit every real dense Qwen3 shape (32B, the 235B attention shapes) and the presets', () => {
    const qwen32b = {
      ...qwen06,
      hidden_size: 5120,
      num_hidden_layers: 64,
      num_attention_heads: 64,
      num_key_value_heads: 8,
      intermediate_size: 25600,
      tie_word_embeddings: false,
    };
    expect(parseQwen3Config(qwen32b)).toMatchObject({ numLayers: 64, hiddenSize: 5120, intermediateSize: 25600 });
    const wide = {
      ...qwen06,
      hidden_size: 4096,
      num_hidden_layers: 94,
      num_attention_heads: 64,
      num_key_value_heads: 4,
      max_position_embeddings: 262144,
    };
    expect(parseQwen3Config(wide)).toMatchObject({ numLayers: 94, numKvHeads: 4, maxPositionEmbeddings: 262144 });
    for (const p of Object.values(QWEN3_PRESETS)) {
      expect(p.numLayers).toBeLessThanOrEqual(CONFIG_CAPS.num_hidden_layers);
      expect(p.vocabSize).toBeLessThanOrEqual(CONFIG_CAPS.vocab_size);
    }
  });
});

describe('row 6: adapter_config.json r and lora_alpha ranges', () => {
  const lora = loraConfig({ r: 2, alpha: 4, targetModules: ['q_proj'] });
  const base = JSON.parse(
    writeAdapter(lora, initLora(QWEN3_PRESETS['Qwen/Qwen3-0.6B'], lora, 0))['adapter_config.json'],
  );
  it.each<[string, Record<string, unknown>, RegExp]>([
    ['r', { r: MAX_LORA_R + 1 }, /field "r" must be a positive integer, got 257 \(allowed range 1\.\.256\)/],
    ['lora_alpha', { lora_alpha: 0 }, /field "lora_alpha" must be > 0, got 0 \(allowed range \(0, 10000\]\)/],
    ['lora_alpha', { lora_alpha: -8 }, /field "lora_alpha" must be > 0, got -8/],
  ])('row 6: adapter %s out of range is refused with the allowed range (%j)', (_field, patch, msg) => {
    expect(() => parseAdapterConfig({ ...base, ...patch })).toThrow(msg);
  });
  it('row 6: loraConfig (sft --r/--alpha, the game config) has the same bounds', () => {
    expect(() => loraConfig({ r: 257, alpha: 1 })).toThrow(/allowed range 1\.\.256/);
    expect(() => loraConfig({ r: 8, alpha: 0 })).toThrow(/allowed range \(0, 10000\]/);
    expect(parseAdapterConfig({ ...base, r: 256, lora_alpha: 0.5 })).toMatchObject({ r: 256, alpha: 0.5 });
  });
});

describe('row 2: checkpoint validation', () => {
  const stamp = runStamp('run-abc');
  const good = { run: stamp, trainer: { round: 3, spyBaseline: { count: 2, mean: 0.25, variance: 0.01 } } };

  it('row 2: a valid trainer state is read back with its run id', () => {
    expect(parseTrainerExtra(structuredClone(good))).toEqual({
      stamp,
      state: { round: 3, spyBaseline: good.trainer.spyBaseline, pending: [] },
    });
  });

  it.each<[string, (x: typeof good) => unknown, string]>([
    [
      'wrong type',
      (x) => {
        (x.trainer as Record<string, unknown>).round = 'abc';
      },
      'extra.trainer.round',
    ],
    [
      'negative round',
      (x) => {
        x.trainer.round = -1;
      },
      'extra.trainer.round',
    ],
    [
      'missing trainer',
      (x) => {
        delete (x as Partial<typeof good>).trainer;
      },
      'extra.trainer',
    ],
    [
      'missing run stamp',
      (x) => {
        delete (x as Partial<typeof good>).run;
      },
      'extra.run',
    ],
    [
      'unknown version',
      (x) => {
        (x.run as unknown as Record<string, unknown>).version = RUN_VERSION + 1;
      },
      'extra.run.version',
    ],
    [
      'unknown format',
      (x) => {
        (x.run as unknown as Record<string, unknown>).format = 'other';
      },
      'extra.run.format',
    ],
    [
      'missing run id',
      (x) => {
        (x.run as unknown as Record<string, unknown>).runId = '';
      },
      'extra.run.runId',
    ],
    [
      'NaN baseline',
      (x) => {
        x.trainer.spyBaseline.mean = NaN;
      },
      'extra.trainer.spyBaseline.mean',
    ],
    [
      'negative variance',
      (x) => {
        x.trainer.spyBaseline.variance = -1;
      },
      'extra.trainer.spyBaseline.variance',
    ],
  ])('row 2: trainer_state.json with %s is refused naming %s', (_what, spoil, field) => {
    const x = structuredClone(good);
    spoil(x);
    const e = thrown(() => parseTrainerExtra(x as unknown as Record<string, unknown>));
    expect(e).toBeInstanceOf(CheckpointError);
    expect(e.message).toMatch(new RegExp(`^trainer_state\\.json: field "${field.replaceAll('.', '\\.')}"`));
  });

  it('row 2: pending samples and the run log are checked field by field', () => {
    const sample = {
      stage: 'summary',
      seat: 0,
      promptTokenIds: [1, 2],
      completionTokenIds: [3],
      oldLogprobs: [-0.5],
      advantage: 1,
      candidateTokenIds: null,
    };
    expect(parsePending(JSON.stringify([{ round: 0, samples: [sample] }]), 10)).toHaveLength(1);
    expect(() => parsePending(JSON.stringify([{ round: 0, samples: [{ ...sample, oldLogprobs: [NaN] }] }]))).toThrow(
      /field "\[0\]\.samples\[0\]\.oldLogprobs"/,
    );
    expect(() =>
      parsePending(JSON.stringify([{ round: 0, samples: [{ ...sample, promptTokenIds: [1, 99] }] }]), 10),
    ).toThrow(/field "\[0\]\.samples\[0\]\.promptTokenIds" must be a list of token ids in 0\.\.9/);
    expect(() => parsePending(JSON.stringify([{ round: 0, samples: [{ ...sample, stage: 'x' }] }]))).toThrow(
      /"\[0\]\.samples\[0\]\.stage"/,
    );
    expect(() => parsePending('{"round": 0}')).toThrow(/pending_samples\.json: must be a list/);
    expect(() => parseRunLog('{"round":0}\n{"round":"x"}\n')).toThrow(/run\.jsonl: line 2: field "round"/);
    expect(() => parseRunLog('{"round":0}\nnot json\n')).toThrow(/run\.jsonl: line 2 is not valid JSON/);
  });

  it('row 2: a saved spyrl_config.json that fails validateConfig is refused naming the field; configDiff names changed settings', () => {
    expect(() => parseSavedConfig('{"groupSize": "three"}')).toThrow(
      /^spyrl_config\.json: field "groupSize" must be an integer/,
    );
    expect(() => parseSavedConfig('{"lora": {"r": 9999}}')).toThrow(/field "lora\.r"/);
    expect(() => parseSavedConfig('{"nope": 1}')).toThrow(/field "nope" unknown key/);
    expect(configDiff(validateConfig({ seed: 1 }), validateConfig({ seed: 2, optimizer: { lr: 0.01 } }))).toEqual([
      'seed',
      'optimizer.lr',
    ]);
  });

  it('row 2: non-finite optimizer moments and negative v are refused naming the tensor', async () => {
    const lora = loraConfig({ r: 1, alpha: 2, targetModules: ['q_proj'] });
    const params = initLora({ ...QWEN3_PRESETS['Qwen/Qwen3-0.6B'], numLayers: 1 }, lora, 0);
    const key = [...params.keys()][0]!;
    const m = new Map([...params].map(([k, v]) => [k, new Float32Array(v.length)]));
    const v = new Map([...params].map(([k, x]) => [k, new Float32Array(x.length).fill(1e-6)]));
    const read = (mm: typeof m, vv: typeof v) =>
      readOptimizerState(
        memorySource('ckpt', new Map(Object.entries(writeOptimizerState({ step: 1, m: mm, v: vv })))),
        params,
      );
    await expect(read(m, v)).resolves.toMatchObject({ step: 1 });
    for (const [what, bad, which, pattern] of [
      ['NaN m', NaN, 'm', /tensor "exp_avg\..*": value NaN at index 5: optimizer moments must be finite/],
      ['Inf m', Infinity, 'm', /tensor "exp_avg\..*": value Infinity at index 5/],
      [
        'negative v',
        -1e-3,
        'v',
        /tensor "exp_avg_sq\..*": value -0\.001.* at index 5: second moments must be finite and >= 0/,
      ],
      ['Inf v', Infinity, 'v', /tensor "exp_avg_sq\..*": value Infinity at index 5/],
    ] as const) {
      const mm = new Map(m),
        vv = new Map(v);
      const t = new Float32Array((which === 'm' ? m : v).get(key)!);
      t[5] = bad;
      (which === 'm' ? mm : vv).set(key, t);
      const e = await rejected(read(mm, vv));
      expect(e, what).toBeInstanceOf(ModelLoadError);
      expect(e.message, what).toMatch(/^optimizer\.safetensors: /);
      expect(e.message, what).toMatch(pattern);
    }
  });

  it('row 2: sft run settings are refused when missing or mistyped, naming the field', () => {
    const sft = {
      seed: 0,
      seqLen: 16,
      batch: 1,
      lr: 0.01,
      schedule: 'constant',
      warmup: 0,
      maxGradNorm: 1,
      weightDecay: 0,
      textSha256: 'a'.repeat(64),
      textFile: '/t.txt',
    };
    expect(parseSftExtra({ run: stamp, sft }).settings).toMatchObject({ seqLen: 16, scheduleSteps: null });
    expect(parseSftExtra({ run: stamp, sft }).settings.weights).toBeUndefined(); // before it was recorded
    expect(parseSftExtra({ run: stamp, sft: { ...sft, weights: 'q4' } }).settings.weights).toBe('q4');
    expect(() => parseSftExtra({ run: stamp, sft: { ...sft, weights: 'int8' } })).toThrow(
      /field "extra\.sft\.weights" must be one of/,
    );
    expect(() => parseSftExtra({ run: stamp, sft: { ...sft, lr: 'fast' } })).toThrow(/field "extra\.sft\.lr"/);
    expect(() => parseSftExtra({ run: stamp, sft: { ...sft, seqLen: undefined } })).toThrow(
      /field "extra\.sft\.seqLen" must be an integer >= 2, got missing/,
    );
    expect(() => parseSftExtra({ run: stamp, sft: { ...sft, schedule: 'cosine' } })).toThrow(
      /field "extra\.sft\.scheduleSteps"/,
    );
    expect(() => parseSftExtra({ sft })).toThrow(/field "extra\.run" is missing/);
  });
});

describe('row 2: autosave validation', () => {
  const meta = {
    version: RUN_VERSION,
    runId: 'r-1',
    savedAt: 1,
    round: 2,
    model: { kind: 'demo' },
    modelName: 'tiny',
    config: validateConfig({}),
    files: [{ name: 'a', size: 3 }],
    ui: null,
  };

  it('row 2: a valid autosave meta gives its run id, round and config, and the format when it has one', () => {
    expect(parseAutosaveMeta(structuredClone(meta))).toMatchObject({
      stamp: { runId: 'r-1', version: RUN_VERSION },
      round: 2,
      format: undefined, // saves from before formats existed
      kernels: {}, // and from before kernel variants were saved
    });
    expect(parseAutosaveMeta({ ...structuredClone(meta), format: { weights: 'q4', kv: 'f16' } }).format).toEqual({
      weights: 'q4',
      kv: 'f16',
    });
    expect(parseAutosaveMeta({ ...structuredClone(meta), kernels: 'gemmF16=off,matmul=tiled' }).kernels).toEqual({
      gemmF16: 'off',
      matmul: 'tiled',
    });
  });

  it.each<[string, Record<string, unknown>, string]>([
    ['wrong type', { round: 'abc' }, 'round'],
    ['unknown version', { version: 99 }, 'version'],
    ['missing version', { version: undefined }, 'version'],
    ['missing run id', { runId: undefined }, 'runId'],
    ['missing config', { config: undefined }, 'config'],
    ['config failing validateConfig', { config: { groupSize: 1 } }, 'config.groupSize'],
    ['bad file list', { files: [{ name: 'a', size: -1 }] }, 'files[0].size'],
    ['an unknown weights format', { format: { weights: 'q8', kv: 'f16' } }, 'format.weights'],
    ['a format without its KV type', { format: { weights: 'bf16' } }, 'format.kv'],
    ['a format that is not an object', { format: 'bf16' }, 'format'],
    ['an unknown kernel switch', { kernels: 'warp=fast' }, 'kernels'],
    ['kernels that are not text', { kernels: { matmul: 'tiled' } }, 'kernels'],
  ])('row 2: autosave meta with %s is refused naming %s', (_what, patch, field) => {
    const e = thrown(() => parseAutosaveMeta({ ...structuredClone(meta), ...patch }));
    expect(e.message).toMatch(new RegExp(`^meta\\.json: field "${field.replace(/[.[\]]/g, '\\$&')}"`));
  });

  it('row 2: documents.json must hold a non-empty list of documents', () => {
    expect(parseRunDocuments(JSON.stringify({ train: [{ id: 'a', report: 'r' }] }))).toEqual({
      train: [{ id: 'a', report: 'r' }],
      evalDocs: [],
    });
    expect(() => parseRunDocuments(undefined)).toThrow(/documents\.json: is missing/);
    expect(() => parseRunDocuments('{"train": []}')).toThrow(/field "train" must be a non-empty list/);
    expect(() => parseRunDocuments('{"train": [{"id": "a", "report": 7}]}')).toThrow(/field "train\[0\]\.report"/);
  });
});

describe('row 5: atomic saves', () => {
  let tmp: string;
  beforeAll(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'spyrl-save-'));
  });
  afterAll(async () => {
    await rm(tmp, { recursive: true, force: true });
  });

  const snapshot = async (dir: string) =>
    Object.fromEntries(
      await Promise.all((await readdir(dir)).sort().map(async (n) => [n, await readFile(join(dir, n), 'utf8')])),
    );

  it('row 5: a crash injected mid-write leaves the previous checkpoint whole, and no partial folder', async () => {
    const dir = join(tmp, 'ckpt');
    await saveFolder(dir, {
      'adapter_model.safetensors': 'old adapter',
      'optimizer.safetensors': 'old optimizer',
      'trainer_state.json': '{"old":1}',
    });
    const before = await snapshot(dir);
    let written = 0;
    const crash = async (path: string, data: FileData) => {
      if (++written === 2) throw new Error('injected crash while writing ' + path);
      await writeFile(path, data);
    };
    await expect(
      saveFolder(
        dir,
        {
          'adapter_model.safetensors': 'NEW adapter',
          'optimizer.safetensors': 'NEW optimizer',
          'trainer_state.json': '{"new":1}',
        },
        { writeFile: crash },
      ),
    ).rejects.toThrow(/injected crash while writing .*ckpt\.partial-.*optimizer\.safetensors/);
    expect(await snapshot(dir)).toEqual(before);
    expect((await readdir(tmp)).filter((n) => n !== 'ckpt')).toEqual([]);
  });

  it('row 5: a completed save replaces the folder whole (no stale file survives) and carries over kept entries', async () => {
    const dir = join(tmp, 'out');
    await saveFolder(dir, { 'model.safetensors.index.json': '{}', 'a.txt': 'old' });
    await mkdir(join(dir, 'checkpoint-1'));
    await writeFile(join(dir, 'checkpoint-1', 'x.json'), 'kept');
    await mkdir(join(dir, 'checkpoint-9'));
    await saveFolder(dir, { 'a.txt': 'new', 'b.txt': 'b' }, { keep: ['checkpoint-1'] });
    expect((await readdir(dir)).sort()).toEqual(['a.txt', 'b.txt', 'checkpoint-1']);
    expect(await readFile(join(dir, 'a.txt'), 'utf8')).toBe('new');
    expect(await readFile(join(dir, 'checkpoint-1', 'x.json'), 'utf8')).toBe('kept');
    expect((await readdir(tmp)).sort()).toEqual(['ckpt', 'out']);
  });

  it('row 5: file names that would leave the folder are refused before anything is replaced', async () => {
    const dir = join(tmp, 'ckpt');
    const before = await snapshot(dir);
    await expect(saveFolder(dir, { '../escape.json': 'x' })).rejects.toThrow(/only plain file names/);
    expect(await snapshot(dir)).toEqual(before);
  });
});

describe('row 2: the engine autosave carries a version and a run id, and resume validates it', () => {
  const DEMO_URL = 'http://demo.invalid/tiny-demo/';
  const runConfig = validateConfig({
    groupSize: 3,
    docTokenBudget: 32,
    summaryMaxTokens: 8,
    roundsPerUpdate: 1,
    evalEvery: 0,
    lora: { r: 2, alpha: 4 },
  });
  const docs = { train: [{ id: 'a', report: 'The agency audited its programs. It found gaps.' }], evalDocs: [] };

  type Spoil = { meta?: (m: SavedRunMeta) => unknown; files?: (f: RunFiles) => RunFiles };
  let spoil: Spoil = {};
  let engine: PlaygroundEngine, saved: SavedRunMeta;

  // One engine for the block (a device and its pipelines are slow on SwiftShader); each case spoils what the storage returns.
  beforeAll(async () => {
    const { files } = makeTinyCheckpoint({
      ...(await qwen3TokenizerFiles()),
      layers: 1,
      hidden: 32,
      heads: 2,
      kvHeads: 1,
      headDim: 16,
      intermediate: 64,
      tied: true,
    });
    const manifest = JSON.stringify({ name: 'tiny-hostile', files: [...files.keys()] });
    const fetchDemo = (async (input: RequestInfo | URL) => {
      const name = String(input).slice(DEMO_URL.length);
      const body = name === 'manifest.json' ? manifest : files.get(name);
      return body === undefined ? new Response('missing', { status: 404 }) : new Response(body as BodyInit);
    }) as typeof fetch;
    const inner = memoryRunStorage();
    const storage: RunStorage = {
      ...inner,
      meta: async () => {
        const m = await inner.meta();
        return m && spoil.meta ? (spoil.meta(m) as SavedRunMeta) : m;
      },
      files: async () => (spoil.files ? spoil.files(await inner.files()) : inner.files()),
    };
    engine = new PlaygroundEngine({
      demoUrl: () => DEMO_URL,
      fetch: fetchDemo,
      storage,
      hubCache: () => memoryHubCache(),
    });
    await engine.loadModel({ kind: 'demo' });
    await engine.startRun({ config: runConfig, ...docs }, () => undefined);
    saved = await engine.autosave(null);
  }, 120_000);
  afterAll(() => engine?.dispose());

  it('row 2: the autosave has version and run id; a resumed run keeps the run id', async () => {
    spoil = {};
    expect(saved).toMatchObject({ version: RUN_VERSION, runId: expect.stringMatching(/^[0-9a-f-]{36}$/) });
    const resumed = await engine.resumeSavedRun(() => undefined);
    expect(resumed.meta.runId).toBe(saved.runId);
    expect((await engine.autosave(null)).runId).toBe(saved.runId);
  });

  it.each<[string, Spoil, RegExp]>([
    [
      'a wrong type in meta.json',
      { meta: (m) => ({ ...m, round: 'abc' }) },
      /meta\.json: field "round" must be an integer >= 0, got "abc"/,
    ],
    ['an unknown autosave version', { meta: (m) => ({ ...m, version: 7 }) }, /meta\.json: field "version" is 7/],
    [
      'a config failing validateConfig',
      { meta: (m) => ({ ...m, config: { ...m.config, groupSize: 99 } }) },
      /meta\.json: field "config\.groupSize"/,
    ],
    [
      'a different run id than its checkpoint',
      { meta: (m) => ({ ...m, runId: 'someone-else' }) },
      /belongs to run .*, not to run someone-else/,
    ],
    [
      'a valid config that differs from its checkpoint',
      { meta: (m) => ({ ...m, config: { ...m.config, seed: 99 } }) },
      /the config given differs from the run's spyrl_config\.json in seed \(saved 0, asked 99\)/,
    ],
    [
      'a trainer state of the wrong type',
      {
        files: (f) => {
          const st = JSON.parse(String(f['trainer_state.json']));
          st.extra.trainer.round = 'abc';
          return { ...f, 'trainer_state.json': JSON.stringify(st) };
        },
      },
      /trainer_state\.json: field "extra\.trainer\.round"/,
    ],
    [
      'documents.json without documents',
      { files: (f) => ({ ...f, 'documents.json': '{"train": []}' }) },
      /documents\.json: field "train" must be a non-empty list/,
    ],
  ])('row 2: resuming an autosave with %s is refused naming the field', async (_what, how, msg) => {
    spoil = how;
    await expect(engine.resumeSavedRun(() => undefined)).rejects.toThrow(msg);
  });
});
