// `spyrl eval`: the held-out evaluation of src/train/evaluate.ts from a terminal. Greedy summaries
// of every held-out report by the base model, the adapter (--adapter) and another checkpoint of
// the same architecture (--compare-model), scored with ROUGE-1/2/L (rouge_score's tokenisation,
// Porter stemming unless the config turns evalStemmer off) and length. No held-out split, no
// evaluation: training documents are never scored instead.
import { readFile, stat, writeFile } from 'node:fs/promises';
import { ModelLoadError } from '../model/errors.ts';
import type { SpyRLConfig } from '../game/config.ts';
import type { SpyDocument } from '../game/documents.ts';
import {
  architectureMismatch,
  coverageNote,
  evalReportJsonl,
  type EvalProgress,
  type EvalReport,
  type EvalSystem,
  type MeanScores,
  type SummaryScores,
} from '../train/evaluate.ts';
import { ENGINE_FLAGS, engineOptions, int, parse, str, UsageError } from './args.ts';
import { openModel, openModelOrRepo, parseHubSpec, requireDir } from './open.ts';

async function readEvalConfig(file: string | undefined, heldOut: number | undefined): Promise<SpyRLConfig> {
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
  if (heldOut !== undefined) raw = { ...raw, evalHeldOut: heldOut };
  try {
    return validateConfig(raw);
  } catch (e) {
    throw new UsageError(`${file ?? 'config'}: ${(e as Error).message}`);
  }
}

/**
 * The held-out reports of --docs (the bundled sample by default), split as training splits them
 * (splitGovReport with config.evalHeldOut). Refuses, naming the file, when nothing is held out.
 */
export async function heldOutDocs(spec: string | undefined, heldOut: number): Promise<SpyDocument[]> {
  const { parseDocuments, splitGovReport } = await import('../game/documents.ts');
  let docs: SpyDocument[], name: string;
  if (!spec || spec === 'bundled' || spec === 'govreport') {
    const { loadGovReportNode } = await import('../game/govreport.node.ts');
    docs = (await loadGovReportNode()).all!;
    name = 'the bundled GovReport sample';
  } else {
    const text = await readFile(spec, 'utf8').catch((e: NodeJS.ErrnoException) => {
      throw new ModelLoadError(spec, e.code === 'ENOENT' ? 'documents file not found' : `cannot read: ${e.message}`);
    });
    docs = parseDocuments(text, spec).map((d) => ({ ...d, source: d.source ?? 'user' }));
    name = spec;
  }
  const held = splitGovReport(docs, heldOut).eval;
  if (held.length === 0) {
    const why =
      heldOut === 0
        ? 'config evalHeldOut is 0'
        : `it has ${docs.length} document(s), ${docs.filter((d) => d.summary).length} with a reference "summary"; a held-out split needs at least 2 documents and references`;
    throw new UsageError(
      `no held-out split in ${name} (${why}): spyrl eval scores held-out reports only, never training documents`,
    );
  }
  return held;
}

const f4 = (x: number) => x.toFixed(4);
const scoreCols = (s: SummaryScores | MeanScores) =>
  `ROUGE-1 ${f4(s.rouge1)}\tROUGE-2 ${f4(s.rouge2)}\tROUGE-L ${f4(s.rougeL)}\ttokens ${Number.isInteger(s.tokens) ? s.tokens : s.tokens.toFixed(1)}`;

/** One line per (report, system), then one mean line per system. */
export function formatEvalReport(report: EvalReport): string {
  const lines: string[] = [];
  for (const d of report.documents) {
    if (d.coverage === 'skipped') {
      lines.push(`${d.id}\t-\t${coverageNote(d)}`);
      continue;
    }
    for (const s of report.systems)
      lines.push(`${d.id}\t${s.key}\t${scoreCols(d.results[s.key]!.scores)}\t${coverageNote(d)}`);
  }
  const n = report.documents.filter((d) => d.coverage !== 'skipped').length;
  for (const s of report.systems)
    lines.push(`mean\t${s.key}\t${scoreCols(report.means[s.key]!)}\t(${n} documents, ${s.label})`);
  return lines.join('\n') + '\n';
}

export async function evalCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' },
    adapter: { type: 'string' },
    'compare-model': { type: 'string' },
    docs: { type: 'string' },
    config: { type: 'string' },
    'held-out': { type: 'string' },
    out: { type: 'string' },
    ...ENGINE_FLAGS,
  });
  const dir = str(f, 'model', true)!;
  const adapterDir = str(f, 'adapter');
  const compareDir = str(f, 'compare-model');
  // A folder, or a Hub repo owner/name[@revision] (e.g. SpyRL/SpyRL-Qwen3-4B-Summarization) when no such folder exists.
  if (compareDir && !(await stat(compareDir).catch(() => null)) && !(await parseHubSpec(compareDir)))
    await requireDir(compareDir, 'compare model folder (or Hub repo owner/name[@revision])');
  const config = await readEvalConfig(
    str(f, 'config'),
    str(f, 'held-out') === undefined ? undefined : int(f, 'held-out', 6, 0),
  );
  const docs = await heldOutDocs(str(f, 'docs'), config.evalHeldOut);
  const [{ GpuPolicy }, { evaluatePolicy }] = await Promise.all([
    import('../train/policy.ts'),
    import('../train/run.ts'),
  ]);
  const engine = engineOptions(f);
  const progress = (p: EvalProgress) => {
    if ((process.stderr as { isTTY?: boolean }).isTTY)
      process.stderr.write(`\r\x1b[2K[eval] ${p.system}: ${p.done}/${p.total} ${p.documentId}`);
  };
  out.write(
    `spyrl eval: ${docs.length} held-out reports, each read up to ${config.evalDocTokenBudget} tokens (longer: ${config.evalOverflow === 'mark' ? 'cut, reference marked as covering more' : 'skipped'}), ` +
      `greedy summaries of at most ${config.evalSummaryMaxTokens} tokens, ROUGE F1 ${config.evalStemmer ? 'with' : 'without'} Porter stemming\n`,
  );

  // Base model and adapter on one device; the compare checkpoint on its own device, checked before any summary.
  const { gpu, model, tokenizer, cfg } = await openModel(dir, adapterDir, engine);
  let other: Awaited<ReturnType<typeof openModelOrRepo>> | null = null;
  let report: EvalReport;
  try {
    if (!tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${dir}`);
    let compare: EvalSystem | undefined;
    if (compareDir) {
      other = await openModelOrRepo(compareDir, engine);
      const mismatch = architectureMismatch(cfg, other.cfg);
      if (mismatch)
        throw new ModelLoadError(
          `${compareDir}/config.json`,
          `--compare-model must have the architecture of --model; it differs in ${mismatch}`,
        );
      if (!other.tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${compareDir}`);
      const otherPolicy = new GpuPolicy(other.model, other.tokenizer);
      compare = { key: 'compare', label: `compare ${compareDir}`, generate: (p, o) => otherPolicy.generate(p, o) };
    }
    // The run core's evaluation (src/train/runEval.ts): the same as the trainer's and the app's.
    report = await evaluatePolicy({
      policy: new GpuPolicy(model, tokenizer),
      tokenizer,
      config,
      docs,
      labels: { base: `base model ${dir}`, adapter: adapterDir ? `adapter ${adapterDir}` : undefined },
      compare,
      onProgress: progress,
    });
  } finally {
    other?.gpu.destroy();
    gpu.destroy();
  }
  if ((process.stderr as { isTTY?: boolean }).isTTY) process.stderr.write('\n');
  out.write(formatEvalReport(report));
  const file = str(f, 'out');
  if (file) {
    await writeFile(file, evalReportJsonl(report));
    out.write(`wrote ${report.documents.length} lines to ${file}\n`);
  }
}
