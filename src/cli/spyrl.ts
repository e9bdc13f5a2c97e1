// `spyrl train` and `spyrl eval`: SpyRL self-play from a terminal, on the same engine as the app.
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ModelLoadError } from '../model/errors.ts';
import { ENGINE_FLAGS, engineOptions, int, num, parse, str, UsageError } from './args.ts';
import { openModel, requireDir } from './open.ts';
import type { SpyDocument } from '../game/documents.ts';

/** --docs FILE (.jsonl/.txt/.md) or the bundled GovReport sample (`bundled`, the default). */
async function loadDocs(spec: string | undefined): Promise<{ train: SpyDocument[]; evalDocs: SpyDocument[] }> {
  const { parseDocuments, splitGovReport } = await import('../game/documents.ts');
  if (!spec || spec === 'bundled' || spec === 'govreport') {
    const { loadGovReportNode } = await import('../game/govreport.node.ts');
    const split = await loadGovReportNode();
    return { train: split.train, evalDocs: split.eval };
  }
  const text = await readFile(spec, 'utf8').catch((e: NodeJS.ErrnoException) => {
    throw new ModelLoadError(spec, e.code === 'ENOENT' ? 'documents file not found' : `cannot read: ${e.message}`);
  });
  const docs = parseDocuments(text, spec);
  // With reference summaries and 3+ documents, hold out the last one per source for evaluation.
  if (docs.length >= 3 && docs.some((d) => d.summary)) {
    const split = splitGovReport(docs.map((d) => ({ ...d, source: d.source ?? 'user' })));
    return { train: split.train, evalDocs: split.eval.filter((d) => d.summary) };
  }
  return { train: docs, evalDocs: [] };
}

async function readConfig(file: string | undefined, seed: number | undefined) {
  const { validateConfig } = await import('../game/config.ts');
  let raw: Record<string, unknown> = {};
  if (file) {
    const text = await readFile(file, 'utf8').catch(() => { throw new ModelLoadError(file, 'config file not found'); });
    try { raw = JSON.parse(text); } catch (e) { throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`); }
  }
  if (seed !== undefined) raw = { ...raw, seed };
  try {
    return validateConfig(raw);
  } catch (e) {
    throw new UsageError(`${file ?? 'config'}: ${(e as Error).message}`);
  }
}

async function readFolder(dir: string): Promise<Record<string, Uint8Array | string>> {
  const files: Record<string, Uint8Array | string> = {};
  for (const name of await readdir(dir)) {
    if (name.endsWith('.safetensors')) files[name] = new Uint8Array(await readFile(join(dir, name)));
    else if (/\.(json|jsonl)$/.test(name)) files[name] = await readFile(join(dir, name), 'utf8');
  }
  return files;
}

/**
 * Peaks of the GPU memory held (gpu.memory, pool included) over the whole run and over each
 * phase of a round: play (summaries and votes, round-start .. reveal) and the update.
 */
function memoryPeaks(gpu: import('../gpu/index.ts').Gpu) {
  const loadedBytes = gpu.memory.inUseBytes; // the weights, before the adapter exists
  let overall = 0, play = 0, update = 0;
  const take = () => {
    const m = gpu.memory;
    overall = Math.max(overall, m.peakBytes);
    const peak = m.peakBytes;
    m.resetPeak();
    return peak;
  };
  return {
    onEvent(e: { type: string }) {
      if (e.type === 'round-start') take();
      else if (e.type === 'reveal') play = Math.max(play, take());
      else if (e.type === 'update') update = Math.max(update, take());
    },
    done() {
      take();
      return { peakBytes: overall, loadedBytes, play, update };
    },
  };
}

const fmtTime = (s: number) => (!Number.isFinite(s) ? '?' : s >= 60 ? `${Math.floor(s / 60)}m${Math.round(s % 60)}s` : `${s.toFixed(0)}s`);

export async function trainCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' }, docs: { type: 'string' }, rounds: { type: 'string' }, out: { type: 'string' },
    config: { type: 'string' }, seed: { type: 'string' }, resume: { type: 'string' }, 'gpu-memory': { type: 'string' }, ...ENGINE_FLAGS,
    'report-memory': { type: 'boolean' },
  });
  const dir = str(f, 'model', true)!;
  const outDir = str(f, 'out', true)!;
  const budget = str(f, 'gpu-memory') === undefined ? undefined : num(f, 'gpu-memory', 0) * 2 ** 30;
  if (!str(f, 'rounds')) throw new UsageError('--rounds is required');
  const rounds = int(f, 'rounds', 1, 1);
  const config = await readConfig(str(f, 'config'), str(f, 'seed') === undefined ? undefined : int(f, 'seed', 0, 0));
  const { train, evalDocs } = await loadDocs(str(f, 'docs'));
  const resumeDir = str(f, 'resume');
  if (resumeDir) await requireDir(resumeDir, 'resume folder');
  const resume = resumeDir ? await readFolder(resumeDir) : undefined;

  const [{ SpyRLTrainer, CONFIG_FILE }, { writeFolder }] = await Promise.all([import('../train/spyrl.ts'), import('../model/peft.node.ts')]);
  const engine = engineOptions(f);
  const { gpu, model, tokenizer } = await openModel(dir, undefined, engine);
  try {
    if (!tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${dir}: the game needs the tokenizer and chat template`);
    // The round's memory plan (src/train/memory.ts), the same the app checks before loading.
    const { planRound, roundPlanOptions, checkPlanFits } = await import('../train/memory.ts');
    const evalCount = config.evalEvery > 0 ? evalDocs.filter((d) => d.summary).length : 0;
    const plan = planRound(model.cfg, roundPlanOptions(config, engine, { evalDocs: evalCount }));
    checkPlanFits(plan, gpu.limits, budget);
    const peaks = f['report-memory'] ? memoryPeaks(gpu) : null;
    const tty = (process.stderr as { isTTY?: boolean }).isTTY;
    const trainer = await SpyRLTrainer.create({
      model, tokenizer, config, train, evalDocs, resume, baseModel: dir,
      onEvent: (e) => {
        peaks?.onEvent(e);
        if (e.type === 'update') out.write(`  update ${e.step}: loss ${e.loss.toFixed(4)}  kl ${e.kl.toFixed(4)}  grad-norm ${e.gradNorm.toPrecision(4)}  lr ${e.lr.toExponential(2)}${e.skipped ? `  SKIPPED: ${e.reason}` : ''}\n`);
        if (e.type === 'eval') out.write(`  eval: ROUGE-L base ${e.base.toFixed(4)}  adapter ${e.adapter.toFixed(4)}\n`);
      },
    });
    if (trainer.round >= rounds) throw new UsageError(`the resumed run has already played ${trainer.round} rounds; ask for more with --rounds`);
    await mkdir(outDir, { recursive: true });
    const started = performance.now();
    const first = trainer.round;
    out.write(`spyrl train: ${train.length} training / ${evalDocs.length} held-out documents, group ${config.groupSize}, rounds ${first + 1}..${rounds}\n`);
    while (trainer.round < rounds) {
      const t0 = performance.now();
      const rec = await trainer.runRound();
      const secs = (performance.now() - t0) / 1000;
      const done = trainer.round - first;
      const eta = ((performance.now() - started) / 1000 / done) * (rounds - trainer.round);
      const summaryTokens = rec.summaries.reduce((n, s) => n + s.tokens, 0);
      if (tty) process.stderr.write('\r\x1b[2K');
      out.write(
        `round ${rec.round + 1}/${rounds}  doc ${rec.documentId}  spy Player ${rec.spyLabel}  ${rec.metrics.spyCaught ? 'caught' : 'escaped'}  vote-acc ${rec.metrics.voteAccuracy.toFixed(2)}` +
          `  spy-suspicion ${rec.metrics.spySuspicion.toFixed(2)}  ${(summaryTokens / secs).toFixed(1)} tok/s  ${secs.toFixed(1)} s\n`,
      );
      if (tty) process.stderr.write(`[${'#'.repeat(Math.round((trainer.round / rounds) * 24)).padEnd(24, '.')}] round ${trainer.round}/${rounds} ETA ${fmtTime(eta)}`);
      if (config.checkpointEvery > 0 && trainer.round % config.checkpointEvery === 0 && trainer.round < rounds) {
        await writeFolder(join(outDir, `checkpoint-${trainer.round}`), await trainer.checkpointFiles());
      }
    }
    if (tty) process.stderr.write('\n');
    const files = await trainer.checkpointFiles();
    await writeFolder(outDir, files);
    out.write(`wrote ${Object.keys(files).join(', ')} to ${outDir} (${CONFIG_FILE} is the config used)\n`);
    if (peaks) {
      const planned = (names: string[]) => Math.max(0, ...plan.phases.filter((p) => names.includes(p.phase)).map((p) => p.total));
      const m = peaks.done();
      out.write(JSON.stringify({
        peakBytes: m.peakBytes, plannedBytes: plan.total, loadedBytes: m.loadedBytes, plannedWeightsBytes: plan.weights,
        phases: {
          play: { peakBytes: m.play, plannedBytes: planned(['summaries', 'reasons', 'votes']) },
          update: { peakBytes: m.update, plannedBytes: planned(['update']) },
        },
      }) + '\n');
    }
    trainer.destroy();
  } finally {
    gpu.destroy();
  }
}

export async function evalCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, { model: { type: 'string' }, adapter: { type: 'string' }, docs: { type: 'string' }, config: { type: 'string' }, ...ENGINE_FLAGS });
  const dir = str(f, 'model', true)!;
  const config = await readConfig(str(f, 'config'), undefined);
  const { train, evalDocs } = await loadDocs(str(f, 'docs'));
  const docs = (evalDocs.length ? evalDocs : train).filter((d) => d.summary);
  if (docs.length === 0) throw new UsageError('no documents with a reference summary to evaluate');
  const [{ GpuPolicy }, { renderPrompt, summaryMessages }, { fitToBudget }, { rougeL }] = await Promise.all([
    import('../train/policy.ts'), import('../game/prompts.ts'), import('../game/documents.ts'), import('../game/rouge.ts'),
  ]);
  const { gpu, model, tokenizer } = await openModel(dir, str(f, 'adapter'), engineOptions(f));
  try {
    if (!tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${dir}`);
    const policy = new GpuPolicy(model, tokenizer);
    const prompts = docs.map((d) => renderPrompt(tokenizer, summaryMessages(fitToBudget(d.report, tokenizer, config.docTokenBudget).text, config.prompts), '', config.prompts));
    const gens = await policy.generate(prompts, { maxTokens: config.summaryMaxTokens, temperature: 0, topP: 1, topK: 0, seeds: docs.map(() => 0) });
    let sum = 0;
    docs.forEach((d, i) => {
      const r = rougeL(d.summary!, gens[i].text).fmeasure;
      sum += r;
      out.write(`${d.id}\tROUGE-L ${r.toFixed(4)}\n`);
    });
    out.write(`mean\tROUGE-L ${(sum / docs.length).toFixed(4)}  (${docs.length} documents, ${str(f, 'adapter') ? 'with adapter' : 'base model'})\n`);
  } finally {
    gpu.destroy();
  }
}
