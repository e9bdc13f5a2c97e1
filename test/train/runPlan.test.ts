// One memory plan for the CLI and the app (src/train/runPlan.ts): the store's check before loading
// (memoryPlanOf, as the model panel shows it) and `spyrl train`'s check (checkRunFits, which
// Run.create calls on the loaded model, with the documents of cli/spyrl.ts loadDocs) give the same
// plan and the same refusal for the same model, config, format, documents and GPU limits/budget.
import { describe, expect, it } from 'vitest';
import { QWEN3_PRESETS, type Qwen3Config } from '../../src/model/config.ts';
import type { Qwen3Model } from '../../src/model/qwen3.ts';
import { DEFAULT_CONFIG, validateConfig, type SpyRLConfig } from '../../src/game/config.ts';
import { loadDocs } from '../../src/cli/spyrl.ts';
import { checkRunFits, modelFormat, planRun, Run } from '../../src/train/run.ts';
import { evalDocCount, planRunMemory } from '../../src/train/runPlan.ts';
import { planRound, roundPlanOptions, type AdapterLimits, type WeightsFormat } from '../../src/train/memory.ts';
import { createAppStore } from '../../src/store/store.ts';
import { memoryPlanOf, selectMemoryInputs } from '../../src/store/modelSlice.ts';
import type { EngineApi } from '../../src/worker/client.ts';

const GiB = 2 ** 30;
const PRESET = 'Qwen/Qwen3-4B-Instruct-2507';
const QWEN3_4B: Qwen3Config = QWEN3_PRESETS[PRESET];
const BIG: AdapterLimits = { maxStorageBufferBindingSize: 2 ** 40, maxBufferSize: 2 ** 40 };
const SMALL: AdapterLimits = { maxStorageBufferBindingSize: 128 * 2 ** 20, maxBufferSize: 256 * 2 ** 20 };

interface Case {
  name: string;
  config: SpyRLConfig;
  weights: WeightsFormat;
  kv: 'f32' | 'f16';
  limits: AdapterLimits;
  budgetGiB: string;
}

/** The app: the store with the preset selected, the adapter probed and the user's budget typed in. */
function appCheck(c: Case) {
  const store = createAppStore({
    engine: {} as EngineApi,
    callback: (f) => f,
    hasWebGpu: true,
    loadBundledDocuments: async () => ({ train: [], eval: [] }),
    saveFile: () => undefined,
  });
  const s = store.getState();
  s.selectModelOption(`preset:${PRESET}`);
  s.setWeights(c.weights);
  s.setKv(c.kv);
  s.setGpuBudget(c.budgetGiB);
  store.setState({
    probe: { available: true, description: 'test', limits: c.limits, features: [] },
    configResult: { config: c.config, error: null },
  });
  return memoryPlanOf(selectMemoryInputs(store.getState()))!;
}

/** What checkRunFits reads of a loaded model: config.json, the device's limits, the weights and KV formats. */
function fakeModel(c: Case): Qwen3Model {
  return {
    cfg: QWEN3_4B,
    gpu: { limits: c.limits },
    weights: { embed: c.weights === 'q4' ? { format: 'q4' } : {} },
    kv: c.kv,
  } as unknown as Qwen3Model;
}

/** `spyrl train --docs bundled --gpu-memory GIB` on the loaded model: Run.create's check. */
async function cliCheck(c: Case) {
  const { evalDocs } = await loadDocs(undefined, c.config.evalHeldOut);
  // What checkRunFits reads of a loaded model: config.json, the device's limits, the weights and KV formats.
  const model = {
    cfg: QWEN3_4B,
    gpu: { limits: c.limits },
    weights: { embed: c.weights === 'q4' ? { format: 'q4' } : {} },
    kv: c.kv,
  } as unknown as Qwen3Model;
  expect(modelFormat(model)).toEqual({ weights: c.weights, kv: c.kv });
  const budgetBytes = c.budgetGiB === '' ? undefined : Number(c.budgetGiB) * GiB;
  try {
    return { plan: checkRunFits(model, { config: c.config, evalDocs, budgetBytes }), problem: null };
  } catch (e) {
    expect(e).toBeInstanceOf(RangeError);
    return { plan: null, problem: (e as Error).message };
  }
}

const cases: Case[] = [
  {
    name: 'default config, q4 / f16, no budget',
    config: DEFAULT_CONFIG,
    weights: 'q4',
    kv: 'f16',
    limits: BIG,
    budgetGiB: '',
  },
  {
    name: 'long evaluation reads (eval phase is the peak), bf16 / f32, 24 GiB',
    config: validateConfig({ evalDocTokenBudget: 8192, evalSummaryMaxTokens: 512, evalEvery: 5, evalHeldOut: 3 }),
    weights: 'bf16',
    kv: 'f32',
    limits: BIG,
    budgetGiB: '24',
  },
  {
    name: 'no evaluation (evalEvery 0)',
    config: validateConfig({ evalEvery: 0 }),
    weights: 'q4',
    kv: 'f16',
    limits: BIG,
    budgetGiB: '',
  },
  { name: 'above a 3 GiB budget', config: DEFAULT_CONFIG, weights: 'q4', kv: 'f32', limits: BIG, budgetGiB: '3' },
  { name: 'above the binding limit', config: DEFAULT_CONFIG, weights: 'bf16', kv: 'f16', limits: SMALL, budgetGiB: '' },
];

describe('one memory plan: the app (store) and spyrl train', () => {
  it.each(cases)('$name', async (c) => {
    const app = appCheck(c);
    const cli = await cliCheck(c);
    expect(cli.problem).toBe(app.problem);
    if (cli.plan) expect(cli.plan).toEqual(app.plan);
    // The evaluation's phase is planned on both sides exactly when the run evaluates.
    expect(app.plan.phases.some((p) => p.phase === 'eval')).toBe(c.config.evalEvery > 0);
  });

  // The app's GPU memory is advice (the panel warns above it), so the worker passes it as
  // keepBudgetBytes, not as a budget: the run keeps the layers the panel shows, and still starts
  // when the plan is above it.
  it.each(cases.filter((c) => c.limits === BIG))('the worker keeps the layers the panel shows: $name', async (c) => {
    const app = appCheck(c);
    const { evalDocs } = await loadDocs(undefined, c.config.evalHeldOut);
    const keepBudgetBytes = c.budgetGiB === '' ? undefined : Number(c.budgetGiB) * GiB;
    const run = planRun(fakeModel(c), { config: c.config, evalDocs, keepBudgetBytes });
    expect(run.keepLayers).toBe(app.plan.keepLayers);
    expect(run).toEqual(app.plan);
    if (c.budgetGiB === '24') expect(run.keepLayers).toBeGreaterThan(0);
  });

  it('plans the evaluation the run will do: a long held-out read can be the peak', () => {
    // No budget: kept layers then fill only what the evaluation holds anyway (with 24 GiB they would
    // make the update the peak).
    const c = { ...cases[1]!, budgetGiB: '' };
    const app = appCheck(c);
    expect(app.plan.peakPhase).toBe('eval');
    const noEval = planRound(QWEN3_4B, roundPlanOptions(c.config, { weights: c.weights, kv: c.kv }));
    expect(app.plan.total).toBeGreaterThan(noEval.total);
  });

  it('the held-out reports planned for: none without evaluation, else those with a reference', async () => {
    const { evalDocs } = await loadDocs(undefined, 3);
    expect(evalDocs.length).toBe(3);
    expect(evalDocCount(validateConfig({ evalHeldOut: 3 }), evalDocs)).toBe(3);
    expect(evalDocCount(validateConfig({ evalHeldOut: 3 }))).toBe(3);
    expect(evalDocCount(validateConfig({ evalHeldOut: 3, evalEvery: 0 }), evalDocs)).toBe(0);
    expect(evalDocCount(validateConfig({}), [{ id: 'a', report: 'no reference' }])).toBe(0);
    expect(planRunMemory(QWEN3_4B, DEFAULT_CONFIG, SMALL, undefined, { weights: 'bf16', kv: 'f16' }).blocking).toBe(
      true,
    );
  });

  it('Run.resume takes a checkpoint only, refused before the model is touched', async () => {
    const untouchable = new Proxy({}, { get: () => expect.unreachable('the model was read') }) as Qwen3Model;
    await expect(
      Run.resume({
        model: untouchable,
        tokenizer: untouchable as never,
        config: DEFAULT_CONFIG,
        train: [],
        evalDocs: [],
        resume: { 'adapter_config.json': '{}' },
      }),
    ).rejects.toThrow('not a checkpoint: trainer_state.json is missing (a PEFT adapter alone starts a new run)');
  });
});
