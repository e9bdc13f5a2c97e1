// `npx tsx bench/prefill-tokens.ts [--docs 8] [--model 4b] [--json FILE]`
// The prompt tokens a default SpyRL round prefills, stage by stage, on the bundled GovReport
// reports with the real Qwen3 tokenizer and chat template: what GpuPolicy runs through the model
// for the summaries and the votes (and the reasons with --reasons), from the same function it
// uses (src/train/policy.ts prefillSources: the pages a prompt borrows in its batch and those it
// adopts from the previous stage's kept cache, GenerateOptions.keepPromptKv), with the cache kept
// (the votes adopt their report) and without. The players' summaries are stand-ins: each report's
// reference summary cut to the round's summary budget (a policy's own summaries only change the
// votes' lengths a little). FLOPs at the model's shapes from bench/e2e.ts tokenFlops at each
// token's context. No GPU: arithmetic over real prompts, not a timing. Asserts nothing.
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { DEFAULT_CONFIG } from '../src/game/config.ts';
import { fitToBudget } from '../src/game/documents.ts';
import { normalizeText } from '../src/game/text.ts';
import { loadGovReportNode } from '../src/game/govreport.node.ts';
import { maskSpan } from '../src/game/masking.ts';
import { reasonPrompts, summaryPrompts, votePrompts, type ChatPrompt } from '../src/game/prompts.ts';
import { assignRoles } from '../src/game/roles.ts';
import { Rng } from '../src/game/rng.ts';
import { loadTokenizer } from '../src/model/tokenizer.ts';
import { memorySource } from '../src/model/sources.ts';
import { qwen3TokenizerFiles } from '../src/model/tinyModel.node.ts';
import { prefillSources } from '../src/train/policy.ts';
import { MODELS, tokenFlops } from './e2e.ts';

const { values } = parseArgs({
  options: {
    docs: { type: 'string', default: '8' },
    model: { type: 'string', default: '4b' },
    reasons: { type: 'boolean', default: false },
    json: { type: 'string' },
  },
});
const cfg = MODELS[values.model!];
if (!cfg) throw new Error(`--model: one of ${Object.keys(MODELS).join(', ')}`);
const game = DEFAULT_CONFIG;
const { tokenizerJson, tokenizerConfig } = await qwen3TokenizerFiles();
const tok = await loadTokenizer(
  memorySource(
    'qwen3',
    new Map([
      ['tokenizer.json', tokenizerJson],
      ['tokenizer_config.json', tokenizerConfig],
    ]),
  ),
);
const docs = (await loadGovReportNode()).train.slice(0, Number(values.docs));

/** Tokens prefilled and their FLOPs (each at its own context) for one call's prompts. */
function prefilled(prompts: ChatPrompt[], kept: ChatPrompt[] | null) {
  const sources = prefillSources(prompts, kept ? kept.map((p) => p.tokenIds) : null);
  let tokens = 0,
    flops = 0,
    adopted = 0;
  sources.forEach((s, b) => {
    const n = prompts[b]!.tokenIds.length;
    tokens += n - s.adopted;
    adopted += s.adopted - s.shared;
    for (let t = s.adopted; t < n; t++) flops += tokenFlops(cfg, t + 1, false);
  });
  return { tokens, flops, adopted };
}

type Stage = { tokens: number; flops: number; adopted: number };
const add = (a: Stage, b: Stage): Stage => ({
  tokens: a.tokens + b.tokens,
  flops: a.flops + b.flops,
  adopted: a.adopted + b.adopted,
});
const zero = (): Stage => ({ tokens: 0, flops: 0, adopted: 0 });
const total = { summaries: zero(), reasons: zero(), reasonsKept: zero(), votes: zero(), votesKept: zero() };
for (const [i, doc] of docs.entries()) {
  const rng = Rng.fromSeed(7).fork(`round/${i}`);
  const budget = fitToBudget(normalizeText(doc.report), tok, game.docTokenBudget);
  const masked = maskSpan(budget.text, tok, {
    maskRatio: game.maskRatio,
    mode: game.maskMode,
    rng: rng.fork('mask'),
    placeholder: game.maskPlaceholder,
  });
  const roles = assignRoles(game.groupSize, rng.fork('roles'));
  const sp = summaryPrompts(tok, roles, masked.full, masked.spyText, game.prompts).prompts;
  const ref = tok.encode(doc.summary ?? '');
  const summary = tok.decode(ref.slice(0, game.summaryMaxTokens)).trim();
  const input = { roles, civilianText: masked.full, spyText: masked.spyText, summaries: sp.map(() => summary) };
  total.summaries = add(total.summaries, prefilled(sp, null));
  let previous = sp,
    reasons: string[] | null = null;
  if (values.reasons) {
    const rp = reasonPrompts(tok, input, game.prompts);
    total.reasons = add(total.reasons, prefilled(rp, null));
    total.reasonsKept = add(total.reasonsKept, prefilled(rp, sp));
    previous = rp;
    reasons = sp.map(() => 'The spy left out the part on staffing.');
  }
  const vp = votePrompts(tok, { ...input, reasons }, game.prompts);
  total.votes = add(total.votes, prefilled(vp, null));
  total.votesKept = add(total.votesKept, prefilled(vp, previous));
}
const n = docs.length;
const row = (name: string, s: Stage) =>
  `${name.padEnd(34)} ${String(Math.round(s.tokens / n)).padStart(7)} ${(s.flops / n / 1e12).toFixed(2).padStart(9)} ${String(Math.round(s.adopted / n)).padStart(8)}`;
console.log(
  `# prompt tokens prefilled a round: ${cfg === MODELS['4b'] ? 'Qwen3-4B' : values.model} shapes, ${n} GovReport reports (docTokenBudget ${game.docTokenBudget}, ${game.groupSize} players, summaries ${game.summaryMaxTokens} tokens), per round`,
);
console.log(`${'stage'.padEnd(34)} ${'tokens'.padStart(7)} ${'TFLOP'.padStart(9)} ${'adopted'.padStart(8)}`);
console.log(row('summaries', total.summaries));
if (values.reasons) {
  console.log(row('reasons, the report prefilled again', total.reasons));
  console.log(row('reasons, the report adopted', total.reasonsKept));
}
console.log(row('votes, the report prefilled again', total.votes));
console.log(row('votes, adopted from the last stage', total.votesKept));
const before = total.summaries.flops + total.reasons.flops + total.votes.flops;
const after = total.summaries.flops + total.reasonsKept.flops + total.votesKept.flops;
console.log(
  `votes: ${(total.votes.tokens / total.votesKept.tokens).toFixed(2)}x the tokens without the kept cache; ` +
    `a round's prefill FLOPs ${(before / n / 1e12).toFixed(2)} -> ${(after / n / 1e12).toFixed(2)} TFLOP (${((1 - after / before) * 100).toFixed(1)}% less)`,
);
if (values.json) writeFileSync(values.json, JSON.stringify({ docs: n, model: values.model, perRound: total }, null, 2));
