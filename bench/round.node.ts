// One SpyRL round split by stage (summaries, votes, update), the game and trainer of
// src/train/spyrl.ts (started as a run: src/train/run.ts) on a model with random weights and the
// real Qwen3 tokenizer, on the bundled GovReport sample. Node only (the tokenizer files and the
// documents are read from disk); bench/run.ts runs it with --parts round.
import type { Gpu } from '../src/gpu/index.ts';
import { validateConfig, type SpyRLConfigInput } from '../src/game/config.ts';
import { loadGovReportNode } from '../src/game/govreport.node.ts';
import { Qwen3Model } from '../src/model/qwen3.ts';
import { memorySource } from '../src/model/sources.ts';
import { makeTinyCheckpoint } from '../src/model/tinyModel.ts';
import { qwen3TokenizerFiles } from '../src/model/tinyModel.node.ts';
import { loadTokenizer } from '../src/model/tokenizer.ts';
import { Run } from '../src/train/run.ts';
import { MODELS, randomWeights, type Format } from './e2e.ts';
import { makeRecord, type BenchRecord } from './measure.ts';

/**
 * quick: 4 players, a 128-token report, 8-token summaries. full: the default game (4 players,
 * 2,048-token report, 256-token summaries). Both update after every round and skip evaluation.
 */
export const ROUND_CONFIG: Record<'quick' | 'full', SpyRLConfigInput> = {
  quick: {
    groupSize: 4,
    docTokenBudget: 128,
    summaryMaxTokens: 8,
    roundsPerUpdate: 1,
    evalEvery: 0,
    checkpointEvery: 0,
  },
  full: { roundsPerUpdate: 1, evalEvery: 0, checkpointEvery: 0 },
};

export async function benchRound(
  gpu: Gpu,
  name: string,
  o: {
    mode: 'quick' | 'full';
    layers?: number;
    format: Format;
    /** The KV cache's type (the app's and the CLI's default is f16). */
    kv?: 'f32' | 'f16';
    /** Rounds played: the last is split by stage, the ones before warm up (default 1). */
    rounds?: number;
    /**
     * The GPU memory the round may fill (`--gpu-memory`, as `spyrl train`'s): the plan is checked
     * against it and the update keeps the layers' activations that fit. Undefined: no budget.
     */
    budgetBytes?: number;
    /** Tokens per prefill chunk (RunOptions.forwardChunk); undefined: the plan's 'auto'. */
    forwardChunk?: number;
    /** Rows of the update's MLP chunks (RunOptions.mlpChunk); undefined: the plan's 'auto'. */
    mlpChunk?: number;
    log: (line: string) => void;
  },
): Promise<BenchRecord[]> {
  const full = MODELS[name];
  const L = o.layers ?? (name === 'tiny' ? full.numLayers : 1);
  const c = { ...full, numLayers: L };
  const config = validateConfig(ROUND_CONFIG[o.mode]);
  const tok = makeTinyCheckpoint({ layers: 1, ...(await qwen3TokenizerFiles()) });
  const tokenizer = await loadTokenizer(memorySource('tokenizer', tok.files));
  const { train, eval: evalDocs } = await loadGovReportNode();
  const { weights, buffers } = randomWeights(gpu, c, o.format);
  const kv = o.kv ?? 'f32';
  const rounds = o.rounds ?? 1;
  const model = new Qwen3Model(gpu, c, weights, { kv });
  o.log(
    `## SpyRL round: ${name} (${L} of ${full.numLayers} layers) ${o.format}, KV ${kv}, ${config.groupSize} players, report <= ${config.docTokenBudget} tokens, summaries <= ${config.summaryMaxTokens} tokens` +
      (rounds > 1 ? `; round ${rounds} of ${rounds} split by stage, the ones before it warm up` : '') +
      (o.budgetBytes === undefined ? '; no GPU memory budget' : `; GPU memory budget ${gib(o.budgetBytes)} GiB`),
  );
  // Through Run.create, as `spyrl train` and the app start a run: the memory plan's checks, and
  // its update pass as the byte budget of the update's packed passes.
  const run = await Run.create({
    model,
    tokenizer,
    config,
    train,
    evalDocs,
    budgetBytes: o.budgetBytes,
    forwardChunk: o.forwardChunk,
    mlpChunk: o.mlpChunk,
    now: () => performance.now(),
  });
  o.log(
    `   memory plan: ${gib(run.plan.total)} GiB at the peak, ${run.plan.keepLayers} of ${L} layers' activations kept in the update's planned pass, prompts prefilled ${run.plan.forwardChunk} tokens a chunk${o.forwardChunk === undefined ? " ('auto')" : ''}, the update's MLP ${run.mlpChunk} rows a chunk${o.mlpChunk === undefined ? " ('auto')" : ''}`,
  );
  try {
    // The rounds before the last: their totals only. The first pays the pipeline compiles (as a
    // user's first round does); the last is the steady state.
    const warm: BenchRecord[] = [];
    const shape =
      `${name} ${o.format} kv=${kv} L=${L} players=${config.groupSize}` +
      (o.budgetBytes === undefined ? '' : ` budget=${gib(o.budgetBytes)}GiB`) +
      ` chunk=${run.plan.forwardChunk} mlp=${run.mlpChunk}`;
    for (let i = 0; i < rounds - 1; i++) {
      const t0 = performance.now();
      const k0 = gpu.pipelineCount;
      await run.step();
      const ms = performance.now() - t0;
      const compiled = `${gpu.pipelineCount - k0} pipelines compiled`;
      o.log(`   round ${i + 1} (warm-up, ${compiled}): ${(ms / 1000).toFixed(2)} s`);
      warm.push(
        makeRecord({
          group: 'e2e',
          name: `round ${i + 1}, warm-up (${compiled}): total`,
          shape,
          flops: 0,
          bytes: 0,
          seconds: ms / 1000,
          reps: 1,
        }),
      );
    }
    const k0 = gpu.pipelineCount;
    const rec = await run.step();
    if (rounds > 1) o.log(`   round ${rounds}: ${gpu.pipelineCount - k0} pipelines compiled`);
    const t = rec.timings;
    const tokens = rec.summaries.reduce((n, s) => n + s.tokens, 0);
    const stage = (what: string, ms: number | null, n?: number) =>
      ms === null
        ? []
        : [
            makeRecord({
              group: 'e2e',
              name: `round: ${what}`,
              shape,
              flops: 0,
              bytes: 0,
              seconds: ms / 1000,
              reps: 1,
              tokens: n,
            }),
          ];
    return [
      ...warm,
      ...stage(`summaries (prefill + ${tokens} sampled tokens)`, t.summarizeMs, tokens),
      // Split by the policy's clock (src/train/policy.ts): the prompts' prefill, then the decode.
      ...stage(`summaries: prefill (${rec.prompts.civilianSummaryTokens}-token prompts)`, t.summaryPrefillMs),
      ...stage(
        `summaries: decode (${tokens} sampled tokens)`,
        t.summarizeMs === null || t.summaryPrefillMs === null ? null : t.summarizeMs - t.summaryPrefillMs,
        tokens,
      ),
      ...stage('votes', t.voteMs),
      // The update's training tokens: its sequences packed by shared prompt (src/train/packing.ts).
      ...(rec.train.packing
        ? stage(
            `update (${rec.train.packing.sequences} sequences in ${rec.train.packing.passes} passes, ${rec.train.packing.tokens} training tokens; ${rec.train.packing.unpackedTokens} one sequence a pass` +
              (rec.train.packing.layers
                ? `; ${rec.train.packing.keptLayers ?? 0} of ${rec.train.packing.layers} layers' activations kept)`
                : ')'),
            t.updateMs,
            rec.train.packing.tokens,
          )
        : stage('update', t.updateMs)),
      ...stage('play (summaries, votes, scoring)', t.totalMs),
      ...stage(
        'round total (play + update)',
        t.totalMs === null || t.updateMs === null ? null : t.totalMs + t.updateMs,
      ),
    ];
  } finally {
    run.destroy();
    model.lora = null;
    for (const b of new Set(buffers)) gpu.releaseBuffer(b);
  }
}

function gib(bytes: number): string {
  return (bytes / 2 ** 30).toFixed(2);
}
