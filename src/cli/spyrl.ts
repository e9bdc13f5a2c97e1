// `spyrl train`: SpyRL self-play from a terminal, on the same engine as the app (`spyrl eval`: eval.ts).
import { createHash } from 'node:crypto';
import { readdir, readFile, stat } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ModelLoadError } from '../model/errors.ts';
import { asModelFormat, describeFormat, formatDiff, type ModelFormat } from '../model/format.ts';
import {
  ENGINE_FLAGS,
  engineOptions,
  FORCE_FLAG,
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
import { openModel, requireDir } from './open.ts';
import { checkOutDir, saveFolder } from './saveFolder.ts';
import type { SpyRLConfig } from '../game/config.ts';
import type { SpyDocument } from '../game/documents.ts';
import type { TrainEvent } from '../train/events.ts';

/** --docs FILE (.jsonl/.txt/.md) or the bundled GovReport sample (`bundled`, the default); `heldOut` (config evalHeldOut) reports held out. */
export async function loadDocs(
  spec: string | undefined,
  heldOut: number,
): Promise<{ train: SpyDocument[]; evalDocs: SpyDocument[] }> {
  const { checkDocumentSize, readDocumentFile, splitGovReport, parseDocuments, GOVREPORT_PATH } =
    await import('../game/documents.ts');
  if (!spec || spec === 'bundled' || spec === 'govreport') {
    const { readGovReportText } = await import('../game/govreport.node.ts');
    const split = splitGovReport(parseDocuments(await readGovReportText(), GOVREPORT_PATH), heldOut);
    return { train: split.train, evalDocs: split.eval };
  }
  const unreadable = (e: NodeJS.ErrnoException): never => {
    throw new ModelLoadError(spec, e.code === 'ENOENT' ? 'documents file not found' : `cannot read: ${e.message}`);
  };
  checkDocumentSize((await stat(spec).catch(unreadable)).size, spec); // before reading it into memory
  const bytes = await readFile(spec).catch(unreadable);
  const { docs, warning } = readDocumentFile(bytes, spec); // the app's upload path too: size cap, UTF-8 check
  if (warning) process.stderr.write(`warning: ${warning}\n`);
  // With reference summaries and 3+ documents, hold out evalHeldOut of them for evaluation.
  if (docs.length >= 3 && docs.some((d) => d.summary)) {
    const split = splitGovReport(
      docs.map((d) => ({ ...d, source: d.source ?? 'user' })),
      heldOut,
    );
    return { train: split.train, evalDocs: split.eval.filter((d) => d.summary) };
  }
  return { train: docs, evalDocs: [] };
}

async function readConfig(file: string | undefined, seed: number | undefined) {
  const { validateConfig } = await import('../game/config.ts');
  let raw: Record<string, unknown> = {};
  if (file) {
    const text = await readFile(file, 'utf8').catch(() => {
      throw new ModelLoadError(file, 'config file not found');
    });
    try {
      raw = JSON.parse(text);
    } catch (e) {
      throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`);
    }
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
  let overall = 0,
    play = 0,
    update = 0;
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

/**
 * spyrl_run.json, beside each checkpoint of `spyrl train`: which documents the run plays (the
 * --docs spec and a SHA-256 of the parsed documents) and how the base model was held (--weights,
 * --kv), so that --resume can adopt them and refuse a --docs that would change the schedule, or
 * a --weights or --kv that would change the base its adapter was trained against. Files written
 * before the format was recorded have no "format": their runs resume with the flags given.
 */
const RUN_FILE = 'spyrl_run.json';
interface RunDocsSpec {
  docs: { spec: string; sha256: string };
  format?: ModelFormat;
}

function docsSha256(docs: { train: SpyDocument[]; evalDocs: SpyDocument[] }): string {
  return createHash('sha256').update(JSON.stringify(docs)).digest('hex');
}

/** A --docs value as stored: bundled stays a name, a file becomes an absolute path. */
function docsSpecOf(spec: string | undefined): string {
  return !spec || spec === 'bundled' || spec === 'govreport' ? 'bundled' : resolve(spec);
}

function parseRunFile(text: string | Uint8Array | undefined): RunDocsSpec | null {
  if (text === undefined) return null;
  let json: unknown;
  try {
    json = JSON.parse(String(text));
  } catch (e) {
    throw new ModelLoadError(RUN_FILE, `not valid JSON (${(e as Error).message})`);
  }
  const d = (json as { docs?: { spec?: unknown; sha256?: unknown } } | null)?.docs;
  if (typeof d?.spec !== 'string' || !d.spec)
    throw new ModelLoadError(RUN_FILE, `field "docs.spec" must be a non-empty string, got ${JSON.stringify(d?.spec)}`);
  if (typeof d.sha256 !== 'string' || !/^[0-9a-f]{64}$/.test(d.sha256))
    throw new ModelLoadError(RUN_FILE, `field "docs.sha256" must be 64 hex digits, got ${JSON.stringify(d.sha256)}`);
  const saved = (json as { format?: unknown }).format;
  if (saved === undefined) return { docs: { spec: d.spec, sha256: d.sha256 } };
  const format = asModelFormat(saved);
  if (!format)
    throw new ModelLoadError(
      RUN_FILE,
      `field "format" must be {"weights": "bf16" or "q4", "kv": "f32" or "f16"}, got ${JSON.stringify(saved)}`,
    );
  return { docs: { spec: d.spec, sha256: d.sha256 }, format };
}

/**
 * The checkpoint's own files, checked before the model is loaded (the trainer checks them again
 * against the model): trainer state, run stamp, optimizer moments, pending rounds, run log.
 */
async function checkCheckpoint(resume: Record<string, Uint8Array | string>): Promise<void> {
  const [{ parseTrainerExtra, parsePending, parseRunLog }, { readOptimizerState }, { memorySource }] =
    await Promise.all([import('../train/checkpoint.ts'), import('../model/peft.ts'), import('../model/sources.ts')]);
  const st = await readOptimizerState(memorySource('checkpoint', new Map(Object.entries(resume))));
  parseTrainerExtra(st.extra);
  if (resume['pending_samples.json'] !== undefined) parsePending(String(resume['pending_samples.json']));
  if (resume['run.jsonl'] !== undefined) parseRunLog(String(resume['run.jsonl']));
}

/**
 * The config of a resumed run is the checkpoint's spyrl_config.json. A --config or --seed that
 * would change it is refused, naming each differing setting (leave them out to continue).
 */
async function resumedConfig(
  resume: Record<string, Uint8Array | string>,
  configFile: string | undefined,
  seed: number | undefined,
): Promise<SpyRLConfig> {
  const { parseSavedConfig, configDiff, configValues, describeDiff } = await import('../train/checkpoint.ts');
  const { CONFIG_FILE } = await import('../train/spyrl.ts');
  const text = resume[CONFIG_FILE];
  if (text === undefined)
    throw new ModelLoadError(
      CONFIG_FILE,
      'is missing from the --resume folder: a checkpoint of spyrl train holds the config it ran with',
    );
  const saved = parseSavedConfig(String(text), CONFIG_FILE);
  if (configFile === undefined && seed === undefined) return saved;
  const asked = configFile === undefined ? { ...saved, seed: seed! } : await readConfig(configFile, seed);
  const diff = configDiff(saved, asked);
  if (diff.length) {
    throw new UsageError(
      `--resume: ${configFile ? `--config ${configFile}` : '--seed'} would change the run: ${describeDiff(configValues(saved), configValues(asked), diff)}; leave ${configFile ? '--config' : '--seed'} out to continue with the checkpoint's ${CONFIG_FILE}`,
    );
  }
  return saved;
}

const fmtTime = (s: number) =>
  !Number.isFinite(s) ? '?' : s >= 60 ? `${Math.floor(s / 60)}m${Math.round(s % 60)}s` : `${s.toFixed(0)}s`;

export async function trainCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' },
    docs: { type: 'string' },
    rounds: { type: 'string' },
    out: { type: 'string' },
    config: { type: 'string' },
    seed: { type: 'string' },
    resume: { type: 'string' },
    'gpu-memory': { type: 'string' },
    ...ENGINE_FLAGS,
    ...PREFILL_CHUNK_FLAG,
    ...MLP_CHUNK_FLAG,
    'report-memory': { type: 'boolean' },
    ...FORCE_FLAG,
  });
  const dir = str(f, 'model', true)!;
  const outDir = str(f, 'out', true)!;
  const budget = gpuMemoryBudget(f);
  const forwardChunk = prefillChunk(f);
  const mlpRows = mlpChunk(f);
  if (!str(f, 'rounds')) throw new UsageError('--rounds is required');
  const rounds = int(f, 'rounds', 1, 1);
  const seed = str(f, 'seed') === undefined ? undefined : int(f, 'seed', 0, 0);
  await checkOutDir(outDir, f.force === true);
  const resumeDir = str(f, 'resume');
  if (resumeDir) await requireDir(resumeDir, 'resume folder');
  const resume = resumeDir ? await readFolder(resumeDir) : undefined;
  // A checkpoint (trainer_state.json) fixes the config and documents; a bare PEFT adapter does not.
  const continuing = resume !== undefined && 'trainer_state.json' in resume;
  if (continuing) await checkCheckpoint(resume);
  const config = continuing
    ? await resumedConfig(resume, str(f, 'config'), seed)
    : await readConfig(str(f, 'config'), seed);
  const savedRun = continuing ? parseRunFile(resume[RUN_FILE]) : null;
  const docsSpec = str(f, 'docs') ?? savedRun?.docs.spec;
  const { train, evalDocs } = await loadDocs(docsSpec, config.evalHeldOut);
  // The base as the checkpoint held it, unless --weights or --kv say otherwise (refused below).
  const flags = engineOptions(f);
  const engine = {
    ...flags,
    ...savedRun?.format,
    ...(str(f, 'weights') === undefined ? {} : { weights: flags.weights }),
    ...(str(f, 'kv') === undefined ? {} : { kv: flags.kv }),
  };
  const format: ModelFormat = { weights: engine.weights, kv: engine.kv };
  const runFile: RunDocsSpec = {
    docs: { spec: docsSpecOf(docsSpec), sha256: docsSha256({ train, evalDocs }) },
    format,
  };
  if (savedRun && savedRun.docs.sha256 !== runFile.docs.sha256) {
    throw new UsageError(
      `--resume: --docs ${docsSpec} would change the run: its documents differ from the checkpoint's (${savedRun.docs.spec}, sha256 ${savedRun.docs.sha256.slice(0, 12)}...); leave --docs out to continue with them`,
    );
  }
  const formatChange = savedRun?.format ? formatDiff(savedRun.format, format) : [];
  if (formatChange.length) {
    const named = formatChange.map((d) => `--${d.startsWith('weights') ? 'weights' : 'kv'}`).join(' and ');
    throw new UsageError(
      `--resume: ${named} would change the base model its adapter was trained against: ${formatChange.join(', ')}; leave ${named} out to continue with ${describeFormat(savedRun!.format!)}`,
    );
  }
  const runJson = JSON.stringify(runFile, null, 2) + '\n';

  const [{ Run }, { CONFIG_FILE }] = await Promise.all([import('../train/run.ts'), import('../train/spyrl.ts')]);
  const { gpu, model, tokenizer } = await openModel(dir, undefined, engine);
  try {
    if (!tokenizer)
      throw new ModelLoadError('tokenizer.json', `not found in ${dir}: the game needs the tokenizer and chat template`);
    const peaks = f['report-memory'] ? memoryPeaks(gpu) : null;
    const tty = (process.stderr as { isTTY?: boolean }).isTTY;
    // The run core (src/train/run.ts): first the round's memory plan, the same the app checks before loading.
    let compiledKernels = 0; // of the round just played (its round-done event)
    const options = {
      model,
      tokenizer,
      config,
      train,
      evalDocs,
      budgetBytes: budget,
      forwardChunk,
      mlpChunk: mlpRows,
      baseModel: dir,
      onEvent: (e: TrainEvent) => {
        peaks?.onEvent(e);
        if (e.type === 'round-done') compiledKernels = e.compiledKernels ?? 0;
        if (e.type === 'update')
          out.write(
            `  update ${e.step}: loss ${e.loss.toFixed(4)}  kl ${e.kl === null ? 'off' : e.kl.toFixed(4)}${e.stages ? `  summaries ${e.stages.summary.loss.toFixed(4)} (grad share ${e.stages.summary.gradShare.toFixed(2)})  votes ${e.stages.vote.loss.toFixed(4)} (grad share ${e.stages.vote.gradShare.toFixed(2)})` : ''}  grad-norm ${e.gradNorm.toPrecision(4)}  lr ${e.lr.toExponential(2)}${e.packing && e.packing.sequences > 0 ? `  trained ${e.packing.tokens} tokens in ${e.packing.passes} passes (${e.packing.unpackedTokens} one sequence a pass)${e.packing.layers ? `, ${e.packing.keptLayers ?? 0} of ${e.packing.layers} layers' activations kept` : ''}` : ''}${e.skipped ? `  SKIPPED: ${e.reason}` : ''}\n`,
          );
        if (e.type === 'eval')
          out.write(`  eval: ROUGE-L base ${e.base.toFixed(4)}  adapter ${e.adapter.toFixed(4)}\n`);
      },
    };
    const run = continuing ? await Run.resume({ ...options, resume }) : await Run.create({ ...options, resume });
    const plan = run.plan;
    if (run.round >= rounds)
      throw new UsageError(`the resumed run has already played ${run.round} rounds; ask for more with --rounds`);
    const written: string[] = []; // this run's checkpoint-N folders, kept when the final save replaces --out
    const started = performance.now();
    const first = run.round;
    out.write(
      `spyrl train: ${train.length} training / ${evalDocs.length} held-out documents, group ${config.groupSize}, rounds ${first + 1}..${rounds}, ${describeFormat(format)}\n`,
    );
    while (run.round < rounds) {
      const t0 = performance.now();
      const rec = await run.step();
      const secs = (performance.now() - t0) / 1000;
      const done = run.round - first;
      const eta = ((performance.now() - started) / 1000 / done) * (rounds - run.round);
      const summaryTokens = rec.summaries.reduce((n, s) => n + s.tokens, 0);
      if (tty) process.stderr.write('\r\x1b[2K');
      out.write(
        `round ${rec.round + 1}/${rounds}  doc ${rec.documentId}  spy Player ${rec.spyLabel}  ${rec.metrics.spyCaught ? 'caught' : 'escaped'}  vote-acc ${rec.metrics.voteAccuracy.toFixed(2)}` +
          `  spy-suspicion ${rec.metrics.spySuspicion.toFixed(2)}  ${(summaryTokens / secs).toFixed(1)} tok/s  ${secs.toFixed(1)} s` +
          // The first round compiles the GPU kernels it uses: its time is not the steady state.
          (compiledKernels > 0 ? `  (${compiledKernels} GPU kernels compiled on first use)` : '') +
          '\n',
      );
      if (tty)
        process.stderr.write(
          `[${'#'.repeat(Math.round((run.round / rounds) * 24)).padEnd(24, '.')}] round ${run.round}/${rounds} ETA ${fmtTime(eta)}`,
        );
      if (config.checkpointEvery > 0 && run.round % config.checkpointEvery === 0 && run.round < rounds) {
        const name = `checkpoint-${run.round}`;
        await saveFolder(join(outDir, name), { ...(await run.checkpointFiles()), [RUN_FILE]: runJson });
        written.push(name);
      }
    }
    if (tty) process.stderr.write('\n');
    const files = { ...(await run.checkpointFiles()), [RUN_FILE]: runJson };
    await saveFolder(outDir, files, { keep: written });
    out.write(`wrote ${Object.keys(files).join(', ')} to ${outDir} (${CONFIG_FILE} is the config used)\n`);
    if (peaks) {
      const planned = (names: string[]) =>
        Math.max(0, ...plan.phases.filter((p) => names.includes(p.phase)).map((p) => p.total));
      const m = peaks.done();
      out.write(
        JSON.stringify({
          peakBytes: m.peakBytes,
          plannedBytes: plan.total,
          loadedBytes: m.loadedBytes,
          plannedWeightsBytes: plan.weights,
          keepLayers: plan.keepLayers, // layers whose activations the update kept (withKeptLayers)
          keepPromptKv: plan.keepPromptKv, // the summaries' KV kept for the votes (planRound)
          forwardChunk: model.chunk, // tokens per prefill chunk the run's forwards took (the plan's)
          mlpChunk: run.mlpChunk, // rows of the MLP chunks the update's passes took (the plan's)
          phases: {
            play: { peakBytes: m.play, plannedBytes: planned(['summaries', 'reasons', 'votes']) },
            update: { peakBytes: m.update, plannedBytes: planned(['update']) },
          },
        }) + '\n',
      );
    }
    run.destroy();
  } finally {
    gpu.destroy();
  }
}
