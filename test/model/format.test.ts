// The app's weights/KV choice: defaults by model size, the q4 size rule, and the weight bytes
// shown in the model panel, checked against the q4 layout written out by hand.
import { describe, expect, it } from 'vitest';
import { QWEN3_PRESETS, type Qwen3Config } from '../../src/model/config.ts';
import { checkFormat, defaultFormat, defaultWeights, q4Problem } from '../../src/model/format.ts';
import { weightBytes } from '../../src/train/memory.ts';
import { createAppStore } from '../../src/store/store.ts';
import { memoryPlanOf, selectMemoryInputs } from '../../src/store/modelSlice.ts';
import type { EngineApi } from '../../src/worker/client.ts';
import type { ModelChoice, ModelFormat } from '../../src/worker/protocol.ts';

const tiny: Qwen3Config = {
  ...QWEN3_PRESETS['Qwen/Qwen3-0.6B'],
  hiddenSize: 64,
  numLayers: 2,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 16,
  intermediateSize: 128,
};

/** q4 bytes from docs/ENGINE.md by hand: N*K/2 bytes of nibbles + one 2-byte f16 scale per 32
 *  elements, rounded up to whole u32 words; (N) norms bf16 at 2 bytes each. */
function q4BytesByHand(cfg: Qwen3Config): number {
  const {
    hiddenSize: C,
    numHeads: NH,
    numKvHeads: NKV,
    headDim: HD,
    intermediateSize: I,
    vocabSize: V,
    numLayers: L,
  } = cfg;
  const packed = (N: number, K: number) => (N * K) / 2 + Math.ceil((N * K) / 64) * 4;
  const layer =
    packed(NH * HD, C) +
    2 * packed(NKV * HD, C) +
    packed(C, NH * HD) +
    2 * packed(I, C) +
    packed(C, I) +
    2 * (2 * C + 2 * HD);
  return packed(V, C) * (cfg.tieWordEmbeddings ? 1 : 2) + L * layer + 2 * C;
}

describe('model format', () => {
  it('defaults to q4 from 1.5B parameters, bf16 below, f16 KV always', () => {
    expect(defaultWeights(QWEN3_PRESETS['Qwen/Qwen3-0.6B'])).toBe('bf16');
    expect(defaultWeights(QWEN3_PRESETS['Qwen/Qwen3-1.7B'])).toBe('q4');
    expect(defaultWeights(QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'])).toBe('q4');
    expect(defaultWeights(QWEN3_PRESETS['Qwen/Qwen3-8B'])).toBe('q4');
    expect(defaultFormat(tiny)).toEqual({ weights: 'bf16', kv: 'f16' });
  });

  it('refuses q4 when a Linear input size is not a multiple of 32, and says which', () => {
    expect(q4Problem(tiny)).toBeNull();
    const odd = { ...QWEN3_PRESETS['Qwen/Qwen3-1.7B'], intermediateSize: 6150 };
    expect(q4Problem(odd)).toContain('intermediate_size is 6150');
    expect(defaultWeights(odd)).toBe('bf16'); // big, but q4 cannot hold it
    expect(() => checkFormat(odd, { weights: 'q4', kv: 'f16' }, 'my/odd')).toThrow(
      'my/odd cannot load as q4: q4 needs the Linear input sizes to be multiples of 32: intermediate_size is 6150',
    );
    expect(() => checkFormat(odd, { weights: 'bf16', kv: 'f16' }, 'my/odd')).not.toThrow();
    expect(() => checkFormat(tiny, { weights: 'bf16', kv: 'f8' as 'f16' }, 'tiny')).toThrow('f32 or f16');
  });

  it("the panel's weight bytes (the memory plan's weightBytes): bf16 = 2 per parameter, q4 = the packed layout", () => {
    for (const cfg of [tiny, ...Object.values(QWEN3_PRESETS)]) {
      const params =
        cfg.vocabSize * cfg.hiddenSize * (cfg.tieWordEmbeddings ? 1 : 2) +
        cfg.numLayers *
          (cfg.hiddenSize * cfg.numHeads * cfg.headDim * 2 +
            cfg.hiddenSize * cfg.numKvHeads * cfg.headDim * 2 +
            3 * cfg.hiddenSize * cfg.intermediateSize +
            2 * cfg.hiddenSize +
            2 * cfg.headDim) +
        cfg.hiddenSize;
      expect(weightBytes(cfg, 'bf16').total).toBe(2 * params);
      expect(weightBytes(cfg, 'q4').total).toBe(q4BytesByHand(cfg));
    }
    // 4B: 8.04 GB bf16, 2.26 GB q4 (a little over a quarter: 4.5 bits per weight).
    const b = QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'];
    expect(weightBytes(b, 'bf16').total / 1e9).toBeCloseTo(8.04, 2);
    expect(weightBytes(b, 'q4').total / 1e9).toBeCloseTo(2.26, 2);
  });
});

describe('app store: weights and KV choice', () => {
  /** An engine that only records what a load was asked for. */
  function recordingStore(cfg: Qwen3Config) {
    const loads: { choice: ModelChoice; format: ModelFormat | undefined }[] = [];
    const engine = {
      inspectModel: async () => ({ name: 'some/model', cfg }),
      loadModel: async (choice: ModelChoice, _p: unknown, format?: ModelFormat) => {
        loads.push({ choice, format });
        return {
          name: 'some/model',
          ref: { kind: 'demo' },
          cfg,
          gpu: { description: 'test', f16: false, subgroups: false },
          format,
          quantizedCache: null,
        };
      },
      listCachedModels: async () => [],
    } as unknown as EngineApi;
    const store = createAppStore({
      engine,
      callback: (f) => f,
      hasWebGpu: true,
      loadBundledDocuments: async () => ({ train: [], eval: [] }),
      saveFile: () => undefined,
    });
    return { store, loads };
  }

  it('sends the model default unless the user picked, and a new model option starts from its default', async () => {
    const { store, loads } = recordingStore(QWEN3_PRESETS['Qwen/Qwen3-1.7B']);
    const s = () => store.getState();
    s().selectModelOption('preset:Qwen/Qwen3-1.7B');
    expect(s().weightsChoice).toBeNull();
    await s().loadModel();
    expect(loads.at(-1)!.format).toEqual({ weights: 'q4', kv: 'f16' });
    s().setWeights('bf16');
    s().setKv('f32');
    await s().loadModel();
    expect(loads.at(-1)!.format).toEqual({ weights: 'bf16', kv: 'f32' });
    s().selectModelOption('preset:Qwen/Qwen3-8B');
    expect(s().weightsChoice).toBeNull();
    expect(s().kvType).toBe('f32'); // the KV type is the user's, not the model's
  });

  it('plans memory with the chosen format', () => {
    const { store } = recordingStore(QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507']);
    const s = () => store.getState();
    store.setState({
      probe: {
        available: true,
        description: 'test',
        limits: { maxBufferSize: 2 ** 32, maxStorageBufferBindingSize: 2 ** 32 },
        features: [],
      },
    });
    s().selectModelOption('preset:Qwen/Qwen3-4B-Instruct-2507');
    const cfg = QWEN3_PRESETS['Qwen/Qwen3-4B-Instruct-2507'];
    const q4 = memoryPlanOf(selectMemoryInputs(s()))!.plan;
    expect(q4.weights).toBe(weightBytes(cfg, 'q4').total);
    expect(q4.options.kv).toBe('f16');
    s().setWeights('bf16');
    s().setKv('f32');
    const bf16 = memoryPlanOf(selectMemoryInputs(s()))!.plan;
    expect(bf16.weights).toBe(weightBytes(cfg, 'bf16').total);
    expect(bf16.kv).toBeGreaterThan(q4.kv);
  });

  it('refuses a q4 load the model cannot hold before anything loads', async () => {
    const { store, loads } = recordingStore({ ...tiny, intermediateSize: 100 });
    const s = () => store.getState();
    s().setWeights('q4');
    expect(await s().loadModel({ kind: 'demo' })).toBe(false);
    expect(s().modelError).toContain('intermediate_size is 100');
    expect(loads).toEqual([]);
  });
});
