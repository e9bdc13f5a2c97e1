// The compare view (loaded lazily): every held-out report with the base model's and the
// adapter's greedy summaries side by side (and a third checkpoint's, e.g. the paper's released
// model), the reference, per-report ROUGE-1/2/L and length, the means, and a JSONL export. The
// in-browser counterpart of the paper's A/B table.
import {
  coverageNote,
  type EvalDocumentResult,
  type EvalReport,
  type MeanScores,
  type SummaryScores,
} from '../train/evaluate.ts';
import { useApp } from '../store/hooks.ts';
import { isBusy } from '../store/runSlice.ts';
import type { CompareKind } from '../store/evalSlice.ts';

const pct = (x: number) => (100 * x).toFixed(1);

function ScoreLine({ s }: { s: SummaryScores | MeanScores }) {
  const truncated =
    typeof s.truncated === 'boolean'
      ? s.truncated
        ? ' · cut at the token cap'
        : ''
      : s.truncated > 0
        ? ` · ${pct(s.truncated)}% cut`
        : '';
  return (
    <span className="eval-scores">
      R-1 {pct(s.rouge1)} · R-2 {pct(s.rouge2)} · R-L {pct(s.rougeL)} ·{' '}
      {Number.isInteger(s.tokens) ? s.tokens : s.tokens.toFixed(0)} tokens{truncated}
    </span>
  );
}

function MeansTable({ report }: { report: EvalReport }) {
  const n = report.documents.filter((d) => d.coverage !== 'skipped').length;
  const rows: [string, (m: MeanScores) => string][] = [
    ['ROUGE-1 F1', (m) => pct(m.rouge1)],
    ['ROUGE-2 F1', (m) => pct(m.rouge2)],
    ['ROUGE-L F1', (m) => pct(m.rougeL)],
    ['summary tokens', (m) => m.tokens.toFixed(0)],
    ['words', (m) => m.words.toFixed(0)],
  ];
  return (
    <table className="eval-means" aria-label="Mean scores">
      <thead>
        <tr>
          <th>mean over {n} reports</th>
          {report.systems.map((s) => (
            <th key={s.key}>{s.label}</th>
          ))}
        </tr>
      </thead>
      <tbody>
        {rows.map(([name, f]) => (
          <tr key={name}>
            <th>{name}</th>
            {report.systems.map((s) => (
              <td key={s.key}>{f(report.means[s.key]!)}</td>
            ))}
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function DocumentRow({ d, report }: { d: EvalDocumentResult; report: EvalReport }) {
  return (
    <article className="eval-doc" aria-label={`Held-out report ${d.id}`} data-testid="eval-doc">
      <h3>
        {d.id} {d.source && <span className="muted">({d.source})</span>}
      </h3>
      <p className={`small ${d.coverage === 'whole' ? 'muted' : 'warn'}`}>{coverageNote(d)}</p>
      {d.coverage !== 'skipped' && (
        <div
          className="eval-cols"
          style={{ gridTemplateColumns: `repeat(${report.systems.length + 1}, minmax(0, 1fr))` }}
        >
          {report.systems.map((s) => (
            <section key={s.key} className="eval-col" aria-label={`${s.label} summary`} data-system={s.key}>
              <h4>{s.label}</h4>
              <p className="eval-text">{d.results[s.key]?.summary || <em className="muted">(empty)</em>}</p>
              {d.results[s.key] && <ScoreLine s={d.results[s.key]!.scores} />}
            </section>
          ))}
          <section className="eval-col eval-ref" aria-label="Reference summary">
            <h4>Reference</h4>
            <p className="eval-text">{d.reference}</p>
          </section>
        </div>
      )}
    </article>
  );
}

export function EvalView() {
  const report = useApp((s) => s.evalReport);
  const atRound = useApp((s) => s.evalAtRound);
  const running = useApp((s) => s.evalRunning);
  const progress = useApp((s) => s.evalProgress);
  const error = useApp((s) => s.evalError);
  const kind = useApp((s) => s.compareKind);
  const repo = useApp((s) => s.compareRepo);
  const setCompare = useApp((s) => s.setCompare);
  const runEvaluation = useApp((s) => s.runEvaluation);
  const exportJsonl = useApp((s) => s.exportEvalJsonl);
  const status = useApp((s) => s.runStatus);
  const canRun = !running && status !== 'none' && status !== 'lost' && !isBusy(status);
  return (
    <section className="card" aria-label="Evaluation">
      <h2>Evaluation on held-out reports</h2>
      <p className="small muted">
        Greedy summaries of reports never played, scored against their reference summaries with ROUGE-1/2/L F1
        (rouge_score&apos;s tokenisation, Porter stemming
        {report && !report.settings.stemmer ? ' off' : ' on'}) and length. Each report is read whole up to the eval
        token budget; a longer one is cut and marked, or skipped.
      </p>
      <div className="row">
        <label>
          Third column{' '}
          <select
            aria-label="Third column"
            value={kind}
            disabled={running}
            onChange={(e) => setCompare(e.target.value as CompareKind)}
          >
            <option value="none">none</option>
            <option value="hub">Hub checkpoint</option>
            <option value="demo">Tiny demo model</option>
          </select>
        </label>
        {kind === 'hub' && (
          <input
            aria-label="Compare checkpoint repo"
            value={repo}
            disabled={running}
            size={38}
            onChange={(e) => setCompare('hub', e.target.value)}
          />
        )}
        <button onClick={() => void runEvaluation()} disabled={!canRun}>
          {running ? 'Evaluating…' : 'Evaluate held-out reports'}
        </button>
        <button onClick={exportJsonl} disabled={!report}>
          Export JSONL
        </button>
      </div>
      {kind === 'hub' && (
        <p className="small muted">
          Any checkpoint of the loaded model&apos;s architecture; the preset is the paper&apos;s released model (a full
          fine-tune of Qwen3-4B-Instruct-2507). It is loaded for the evaluation and freed after it.
        </p>
      )}
      {status === 'none' && (
        <p className="small muted">Start a run (or play a round) to compare its adapter with the base model.</p>
      )}
      {progress && (
        <p className="small" role="status">
          {progress}
        </p>
      )}
      {error && (
        <p className="error" role="alert">
          {error}
        </p>
      )}
      {report && (
        <>
          <p className="small muted" data-testid="eval-meta">
            After round {atRound}: {report.documents.length} held-out reports, read up to{' '}
            {report.settings.docTokenBudget} tokens, summaries of at most {report.settings.summaryMaxTokens} tokens.
          </p>
          <MeansTable report={report} />
          {report.documents.map((d) => (
            <DocumentRow key={d.id} d={d} report={report} />
          ))}
        </>
      )}
    </section>
  );
}
