// `npx tsx bench/pack-ab.ts [--reps 2] [--shape tiny|small|4b] [--layers 4] [--weights bf16|q4]
//  [--doc-tokens 128] [--summary-tokens 8]`
// Prefix sharing in the update (src/train/packing.ts) side by side: the same SpyRL round (same
// seed, same report, the real Qwen3 tokenizer and chat template, random weights) played by two
// trainers, one packing the update's sequences (the default) and one running each alone
// (packPrefixes: false), alternated A B A B so that drift in the machine's load hits both. Per
// side: the update's milliseconds, the training tokens it ran and the tokens unpacked, and the
// passes; then the ratio of the median update times (> 1: packing is faster). The byte budget is
// the one `spyrl train` and the app give (the memory plan's update pass), so what packs here is
// what packs in a run. A benchmark, not a test: nothing here asserts a time.
// Shapes: 'tiny' (hidden 64, 2 layers) and 'small' (hidden 256, 4 layers, 4/2 heads of 64, MLP
// 768), both with the real 151,936-token vocabulary, and '4b' (Qwen3-4B's layers, --layers of its
// 36; scripts/device-run.sh runs it on a GPU at the default game's 2,048-token report and
// 256-token summaries). The layers are random, so are the summaries.
import '../bin/gpu-env.mjs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { validateConfig } from '../src/game/config.ts';
import { loadGovReportNode } from '../src/game/govreport.node.ts';
import { Qwen3Model } from '../src/model/qwen3.ts';
import { memorySource } from '../src/model/sources.ts';
import { makeTinyCheckpoint } from '../src/model/tinyModel.ts';
import { qwen3TokenizerFiles } from '../src/model/tinyModel.node.ts';
import { loadTokenizer } from '../src/model/tokenizer.ts';
import { checkRunFits } from '../src/train/run.ts';
import { SpyRLTrainer } from '../src/train/spyrl.ts';
import { abModel, randomWeights } from './e2e.ts';
import { adapterName } from './suite.ts';

const { values } = parseArgs({
  options: {
    reps: { type: 'string', default: '2' },
    shape: { type: 'string', default: 'tiny' },
    layers: { type: 'string', default: '4' },
    weights: { type: 'string', default: 'bf16' },
    'doc-tokens': { type: 'string', default: '128' },
    'summary-tokens': { type: 'string', default: '8' },
  },
});
const { cfg, format } = abModel(values.shape, values.layers, values.weights);
const reps = Number(values.reps);
const config = validateConfig({
  groupSize: 4,
  docTokenBudget: Number(values['doc-tokens']),
  summaryMaxTokens: Number(values['summary-tokens']),
  roundsPerUpdate: 1,
  evalEvery: 0,
  checkpointEvery: 0,
});

const gpu = await createGpu();
const tok = makeTinyCheckpoint({ layers: 1, ...(await qwen3TokenizerFiles()) });
const tokenizer = await loadTokenizer(memorySource('tokenizer', tok.files));
const { train, eval: evalDocs } = await loadGovReportNode();
const { weights } = randomWeights(gpu, cfg, format);
const model = new Qwen3Model(gpu, cfg, weights);
const plan = checkRunFits(model, { config, evalDocs });
const packBytes = plan.phases.find((p) => p.phase === 'update')!.activations;
console.log(
  `# ${adapterName(gpu)}; ${values.shape} (hidden ${cfg.hiddenSize}, ${cfg.numLayers} layers, ${format}), ${config.groupSize} players, report <= ${config.docTokenBudget} tokens, summaries <= ${config.summaryMaxTokens} tokens; pass budget ${(packBytes / 2 ** 20).toFixed(1)} MiB`,
);

type Side = 'packed' | 'alone';
const results: Record<Side, { ms: number; tokens: number; unpacked: number; passes: number; sequences: number }[]> = {
  packed: [],
  alone: [],
};
// Rep -1 warms up both sides (pipeline compiles: the tree attention kernels are their own
// variants) and is not counted.
for (let r = -1; r < reps; r++) {
  for (const side of ['packed', 'alone'] as const) {
    let packing = { sequences: 0, passes: 0, tokens: 0, unpackedTokens: 0 };
    const trainer = await SpyRLTrainer.create({
      model,
      tokenizer,
      config,
      train,
      evalDocs,
      now: () => performance.now(),
      packBytes,
      packPrefixes: side === 'packed',
      onEvent: (e) => {
        if (e.type === 'update' && e.packing) packing = e.packing;
      },
    });
    try {
      const rec = await trainer.runRound();
      const x = {
        ms: rec.timings.updateMs!,
        tokens: packing.tokens,
        unpacked: packing.unpackedTokens,
        passes: packing.passes,
        sequences: packing.sequences,
      };
      if (r >= 0) results[side].push(x);
      console.log(
        `${side.padEnd(6)} ${r < 0 ? 'warm-up' : `rep ${r}`}: update ${x.ms.toFixed(0)} ms, ${x.sequences} sequences in ${x.passes} passes, ${x.tokens} tokens (${x.unpacked} unpacked)`,
      );
    } finally {
      trainer.destroy();
      model.lora = null;
    }
  }
}
const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const mp = median(results.packed.map((x) => x.ms)),
  ma = median(results.alone.map((x) => x.ms));
const p0 = results.packed[0]!;
console.log(
  `\n| side | update ms (median of ${reps}) | training tokens | passes |\n|---|---|---|---|\n` +
    `| alone | ${ma.toFixed(0)} | ${results.alone[0]!.tokens} | ${results.alone[0]!.passes} |\n` +
    `| packed | ${mp.toFixed(0)} | ${p0.tokens} | ${p0.passes} |\n\n` +
    `tokens packed / alone ${(p0.tokens / p0.unpacked).toFixed(3)}; update time alone / packed ${(ma / mp).toFixed(2)}x`,
);
gpu.destroy();
process.exit(0);
