// `spyrl memory`: the GPU memory plan of a SpyRL round (src/train/memory.ts) as one JSON line,
// for a model folder, a config.json or a preset, without touching the GPU.
import { readFile } from 'node:fs/promises';
import { ModelLoadError } from '../model/errors.ts';
import {
  bool,
  engineOptions,
  ENGINE_FLAGS,
  gpuMemoryBudget,
  int,
  mlpChunk,
  MLP_CHUNK_FLAG,
  parse,
  prefillChunk,
  PREFILL_CHUNK_FLAG,
  str,
  UsageError,
} from './args.ts';
import { modelSource } from './open.ts';

const CHECKPOINTS = ['f32', 'f16', 'bf16'] as const;

/**
 * The README's table (section "Memory plan"): the default round (4 players, 2,048-token reports,
 * 256-token summaries, LoRA r=16 on all 7 targets, training) of every Qwen3 preset, bf16 and q4
 * weights, f16 KV cache. test/train/memoryPlan.test.ts checks the README against it.
 */
export async function planTableMarkdown(): Promise<string> {
  const [{ QWEN3_PRESETS, paramCount }, { DEFAULT_CONFIG }, { planRound, roundPlanOptions }] = await Promise.all([
    import('../model/config.ts'),
    import('../game/config.ts'),
    import('../train/memory.ts'),
  ]);
  const g = (b: number) => (b / 2 ** 30).toFixed(2);
  const rows = [
    '| model | weights | weights GiB | LoRA + AdamW GiB | KV cache (votes) GiB | training pass GiB | peak phase | total GiB |',
    '|---|---|---|---|---|---|---|---|',
  ];
  for (const [name, cfg] of Object.entries(QWEN3_PRESETS)) {
    for (const weights of ['bf16', 'q4'] as const) {
      const p = planRound(cfg, roundPlanOptions(DEFAULT_CONFIG, { weights, kv: 'f16' }));
      const votes = p.phases.find((ph) => ph.phase === 'votes')!;
      const update = p.phases.find((ph) => ph.phase === 'update')!;
      rows.push(
        `| ${name} (${(paramCount(cfg) / 1e9).toFixed(2)} B) | ${weights} | ${g(p.weights)} | ${g(p.lora)} | ${g(votes.kv)} | ${g(update.activations)} | ${p.peakPhase} | **${g(p.total)}** |`,
      );
    }
  }
  return rows.join('\n');
}

async function readJson(file: string, what: string): Promise<unknown> {
  const text = await readFile(file, 'utf8').catch(() => {
    throw new ModelLoadError(file, `${what} not found`);
  });
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`);
  }
}

export async function memoryCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' },
    config: { type: 'string' },
    preset: { type: 'string' },
    'run-config': { type: 'string' },
    ...ENGINE_FLAGS,
    players: { type: 'string' },
    'doc-tokens': { type: 'string' },
    'summary-tokens': { type: 'string' },
    'reason-tokens': { type: 'string' },
    'lora-r': { type: 'string' },
    'lora-targets': { type: 'string' },
    checkpoints: { type: 'string' },
    ...MLP_CHUNK_FLAG,
    'keep-layers': { type: 'string' },
    'gpu-memory': { type: 'string' },
    ...PREFILL_CHUNK_FLAG,
    training: { type: 'string' },
    'eval-docs': { type: 'string' },
    table: { type: 'boolean' },
  });
  if (f.table) {
    out.write((await planTableMarkdown()) + '\n');
    return;
  }
  const sources = (['model', 'config', 'preset'] as const).filter((k) => str(f, k) !== undefined);
  if (sources.length !== 1)
    throw new UsageError('give exactly one of --model DIR, --config config.json or --preset NAME');
  const engine = engineOptions(f);
  const checkpoints = str(f, 'checkpoints');
  if (checkpoints !== undefined && !(CHECKPOINTS as readonly string[]).includes(checkpoints))
    throw new UsageError(`--checkpoints must be ${CHECKPOINTS.join(', ')} (got "${checkpoints}")`);
  const [
    { parseQwen3Config, QWEN3_PRESETS },
    { validateConfig },
    { LORA_TARGETS },
    { planRound, roundPlanOptions, withKeptLayers },
  ] = await Promise.all([
    import('../model/config.ts'),
    import('../game/config.ts'),
    import('../model/peft.ts'),
    import('../train/memory.ts'),
  ]);

  let cfg;
  if (sources[0] === 'preset') {
    const name = str(f, 'preset')!;
    if (!Object.hasOwn(QWEN3_PRESETS, name))
      throw new UsageError(`--preset: unknown "${name}" (presets: ${Object.keys(QWEN3_PRESETS).join(', ')})`);
    cfg = QWEN3_PRESETS[name as keyof typeof QWEN3_PRESETS];
  } else {
    const model = str(f, 'model');
    // A folder or a Hub repo (only its config.json is read).
    const json = model
      ? await import('../model/sources.ts').then(async (m) => m.readJson(await modelSource(model), 'config.json'))
      : await readJson(str(f, 'config')!, 'config.json');
    cfg = parseQwen3Config(json);
  }

  // The round: the SpyRL defaults (or --run-config), then the flags.
  const runFile = str(f, 'run-config');
  let run;
  try {
    run = validateConfig(runFile ? await readJson(runFile, 'run config') : {});
  } catch (e) {
    if (e instanceof ModelLoadError) throw e;
    throw new UsageError(`${runFile}: ${(e as Error).message}`);
  }
  const targets =
    str(f, 'lora-targets')
      ?.split(',')
      .map((t) => t.trim())
      .filter(Boolean) ?? run.lora.targetModules;
  const bad = targets.find((t) => !(LORA_TARGETS as readonly string[]).includes(t));
  if (bad !== undefined || targets.length === 0)
    throw new UsageError(
      `--lora-targets: ${bad === undefined ? 'empty' : `unknown "${bad}"`} (targets: ${LORA_TARGETS.join(', ')})`,
    );
  const reasonTokens = int(f, 'reason-tokens', run.voteReason ? run.voteReasonMaxTokens : 0, 0);
  const opts = roundPlanOptions(
    {
      groupSize: int(f, 'players', run.groupSize, 3),
      docTokenBudget: int(f, 'doc-tokens', run.docTokenBudget, 1),
      summaryMaxTokens: int(f, 'summary-tokens', run.summaryMaxTokens, 1),
      voteReason: reasonTokens > 0,
      voteReasonMaxTokens: reasonTokens,
      prompts: run.prompts,
      maskRatio: run.maskRatio,
      maskMode: run.maskMode,
      maskPlaceholder: run.maskPlaceholder,
      lora: {
        r: int(f, 'lora-r', run.lora.r, 1),
        alpha: run.lora.alpha,
        targetModules: targets as typeof run.lora.targetModules,
      },
    },
    engine,
    {
      checkpoints: checkpoints as (typeof CHECKPOINTS)[number] | undefined,
      mlpChunk: mlpChunk(f) ?? 'auto',
      training: bool(f, 'training', true),
      evalDocs: int(f, 'eval-docs', 0, 0),
      forwardChunk: prefillChunk(f) ?? 'auto',
    },
  );
  if (opts.players > 8) throw new UsageError(`--players must be at most 8 (got ${opts.players})`);
  const keep = str(f, 'keep-layers') ?? 'auto';
  if (keep !== 'auto') {
    if (!/^\d+$/.test(keep) || Number(keep) > cfg.numLayers)
      throw new UsageError(`--keep-layers must be auto or an integer in 0..${cfg.numLayers} (got "${keep}")`);
    opts.keepLayers = Number(keep);
  }
  // auto: as many kept layers as the round's own peak, or --gpu-memory, leaves room for (what a run does).
  const p =
    keep === 'auto' ? withKeptLayers(planRound(cfg, opts), undefined, gpuMemoryBudget(f)) : planRound(cfg, opts);
  out.write(
    JSON.stringify({
      weights: p.weights,
      kv: p.kv,
      lora: p.lora,
      activations: p.activations,
      workspace: p.workspace,
      total: p.total,
      peakPhase: p.peakPhase,
      phases: Object.fromEntries(
        p.phases.map((ph) => [
          ph.phase,
          { total: ph.total, kv: ph.kv, activations: ph.activations, workspace: ph.workspace },
        ]),
      ),
      largestBuffer: p.largestBuffer,
      sequences: p.sequences,
      format: {
        weights: engine.weights,
        kv: engine.kv,
        checkpoints: p.options.checkpoints,
        mlpChunk: p.mlpChunk, // rows of the update's MLP chunks (planRound 'auto', withKeptLayers)
        keepLayers: p.keepLayers,
        keepPromptKv: p.keepPromptKv, // the summaries' KV cache kept for the votes (planRound 'auto')
        prefillChunk: p.forwardChunk, // tokens per prefill chunk (planRound 'auto')
      },
    }) + '\n',
  );
}
