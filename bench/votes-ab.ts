// `npx tsx bench/votes-ab.ts`
// The votes call (GpuPolicy.voteLogprobs) of one SpyRL round with the summaries' KV cache kept
// for it (GenerateOptions.keepPromptKv: the votes run in that cache and prefill only past their
// report) against without (the report prefilled again), alternated, on this machine's adapter:
// a Qwen3-shaped model with random weights (hidden 256, 4 layers, 4/2 heads of 64), the real
// tokenizer and chat template, the first bundled GovReport report cut to 512 tokens, 4 players,
// 8-token summaries. One warm-up of each first (pipeline compiles). Prints each rep's time,
// prefilled and adopted tokens, and the ratio of the medians. A benchmark, not a test: it asserts
// nothing.
import '../bin/gpu-env.mjs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createGpu } from '../src/gpu/index.ts';
import { nodeFolderSource } from '../src/model/sources.node.ts';
import { loadQwen3WithTokenizer } from '../src/model/load.ts';
import { writeTinyCheckpoint } from '../src/model/tinyModel.node.ts';
import { DEFAULT_PROMPTS, labelTokenIds, summaryPrompts, votePrompts } from '../src/game/prompts.ts';
import { fitToBudget } from '../src/game/documents.ts';
import { maskSpan } from '../src/game/masking.ts';
import { loadGovReportNode } from '../src/game/govreport.node.ts';
import { assignRoles } from '../src/game/roles.ts';
import { Rng } from '../src/game/rng.ts';
import { GpuPolicy } from '../src/train/policy.ts';
const gpu = await createGpu();
const tmp = await mkdtemp(join(tmpdir(), 'votes-ab-'));
await writeTinyCheckpoint(tmp, {
  layers: 4,
  hidden: 256,
  heads: 4,
  kvHeads: 2,
  headDim: 64,
  intermediate: 768,
  seed: 3,
});
const { model, tokenizer } = await loadQwen3WithTokenizer(gpu, nodeFolderSource(tmp));
const tok = tokenizer!;
const doc = (await loadGovReportNode()).train[0]!;
const b = fitToBudget(doc.report, tok, 512);
const masked = maskSpan(b.text, tok, { maskRatio: 0.2, mode: 'remove', rng: Rng.fromSeed(5).fork('mask') });
const roles = assignRoles(4, Rng.fromSeed(9));
const sp = summaryPrompts(tok, roles, masked.full, masked.spyText, DEFAULT_PROMPTS).prompts;
const G = 8;
const words = roles.labels.map(() => Array.from({ length: 4 * G }, () => 'word').join(' '));
const atBudget = { roles, civilianText: masked.full, spyText: masked.spyText, summaries: words };
const voteCall = { prompts: votePrompts(tok, { ...atBudget, reasons: null }, DEFAULT_PROMPTS), maxTokens: 0 };
const labels = labelTokenIds(tok, 4);
const run = async (keep: boolean) => {
  const policy = new GpuPolicy(model!, tok);
  const gens = await policy.generate(sp, {
    maxTokens: G,
    temperature: 1,
    topK: 0,
    topP: 1,
    seeds: [1, 2, 3, 4],
    keepPromptKv: keep,
    nextCalls: [voteCall],
  });
  const vp = votePrompts(
    tok,
    { roles, civilianText: masked.full, spyText: masked.spyText, summaries: gens.map((g) => g.text), reasons: null },
    DEFAULT_PROMPTS,
  );
  await gpu.sync();
  const p0 = policy.prefilledTokens;
  const t0 = performance.now();
  await policy.voteLogprobs(
    vp,
    vp.map(() => labels),
  );
  await gpu.sync();
  return { ms: performance.now() - t0, prefilled: policy.prefilledTokens - p0, adopted: policy.adoptedTokens };
};
await run(true);
await run(false); // warm-up (pipelines)
const r: Record<string, number[]> = { kept: [], fresh: [] };
for (let i = 0; i < 4; i++) {
  for (const keep of [true, false]) {
    const x = await run(keep);
    r[keep ? 'kept' : 'fresh'].push(x.ms);
    console.log(keep ? 'kept ' : 'fresh', x.ms.toFixed(0), 'ms, prefilled', x.prefilled, 'adopted', x.adopted);
  }
}
const med = (a: number[]) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]!;
console.log(
  `votes call: fresh / kept = ${(med(r.fresh) / med(r.kept)).toFixed(2)} (medians ${med(r.fresh).toFixed(0)} / ${med(r.kept).toFixed(0)} ms)`,
);
gpu.destroy();
