// Training curves: small multiples over the append-only series (per round, per optimizer
// step, per evaluation).
import { lazy, Suspense } from 'react';
import { useApp } from '../store/hooks.ts';
import type { Series } from '../store/rounds.ts';

// recharts (and its d3 and redux) is its own chunk, fetched when the first curve has a point:
// the page opens and loads a model without it.
const ChartPlot = lazy(() => import('./ChartPlot.tsx').then((m) => ({ default: m.ChartPlot })));

const WIDTH = 300;
const HEIGHT = 170;

interface ChartSpec {
  title: string;
  data: keyof Series;
  lines: { key: string; name: string }[];
  domain?: [number, number];
  empty: string;
  /** Shown instead of the chart when every point's value is null (a metric that was not computed). */
  off?: string;
  /** The lines are parts of one total: drawn as stacked areas. */
  stacked?: boolean;
}

function Chart({ spec, series }: { spec: ChartSpec; series: Series }) {
  const data = series[spec.data] as unknown as Record<string, number | null>[];
  const dots = data.length <= 40;
  // A metric that was not computed is null in every point: say "off", never draw a 0.
  const off =
    data.length > 0 && data.every((p) => spec.lines.every((l) => p[l.key] === null || p[l.key] === undefined));
  return (
    <figure
      className="chart"
      aria-label={spec.title}
      data-points={off ? 0 : data.length}
      data-off={off ? 'true' : undefined}
    >
      <figcaption>{spec.title}</figcaption>
      {data.length === 0 ? (
        <p className="muted small empty">{spec.empty}</p>
      ) : off ? (
        <p className="muted small off">off: {spec.off ?? 'not computed in this run'}</p>
      ) : (
        <Suspense fallback={<div className="chart-loading" style={{ width: WIDTH, height: HEIGHT }} />}>
          <ChartPlot
            data={data}
            lines={spec.lines}
            domain={spec.domain}
            dots={dots}
            width={WIDTH}
            height={HEIGHT}
            stacked={spec.stacked}
          />
        </Suspense>
      )}
    </figure>
  );
}

export function Charts() {
  const series = useApp((s) => s.series);
  const every = useApp((s) => s.runConfig ?? s.configResult.config);
  const perUpdate = every
    ? `after the first optimizer step (every ${every.roundsPerUpdate} round${every.roundsPerUpdate === 1 ? '' : 's'})`
    : 'after the first optimizer step';
  const evalNote =
    every && every.evalEvery > 0 ? `every ${every.evalEvery} rounds` : 'when the eval interval is above 0';
  const specs: ChartSpec[] = [
    {
      title: 'Summary reward by role',
      data: 'rounds',
      lines: [
        { key: 'civilianReward', name: 'civilians' },
        { key: 'spyReward', name: 'spy' },
      ],
      empty: 'Appears after the first round.',
    },
    {
      title: 'Spy caught (last 10 rounds)',
      data: 'rounds',
      lines: [{ key: 'caughtRate', name: 'caught rate' }],
      domain: [0, 1],
      empty: 'Appears after the first round.',
    },
    {
      title: 'Civilian vote accuracy',
      data: 'rounds',
      lines: [{ key: 'voteAccuracy', name: 'accuracy' }],
      domain: [0, 1],
      empty: 'Appears after the first round.',
    },
    { title: 'Policy loss', data: 'updates', lines: [{ key: 'loss', name: 'loss' }], empty: `Appears ${perUpdate}.` },
    {
      title: 'Loss by stage',
      data: 'updates',
      lines: [
        { key: 'summaryLoss', name: 'summaries' },
        { key: 'voteLoss', name: 'votes' },
      ],
      empty: `Appears ${perUpdate}.`,
    },
    {
      title: 'Grad-norm share by stage',
      data: 'updates',
      lines: [
        { key: 'summaryGradShare', name: 'summaries' },
        { key: 'voteGradShare', name: 'votes' },
      ],
      domain: [0, 1],
      empty: `Appears ${perUpdate}.`,
    },
    {
      title: 'KL to the base model',
      data: 'updates',
      lines: [{ key: 'kl', name: 'KL' }],
      empty: `Appears ${perUpdate}.`,
      off: 'klBeta is 0, so the KL is not computed',
    },
    {
      title: 'Gradient norm',
      data: 'updates',
      lines: [{ key: 'gradNorm', name: 'grad norm' }],
      empty: `Appears ${perUpdate}.`,
    },
    {
      title: 'ROUGE-L on held-out reports',
      data: 'evals',
      lines: [
        { key: 'base', name: 'base' },
        { key: 'adapter', name: 'adapter' },
      ],
      domain: [0, 1],
      empty: `Measured ${evalNote}.`,
    },
    {
      title: 'Tokens per second',
      data: 'rounds',
      lines: [{ key: 'tokensPerSecond', name: 'tokens/s' }],
      empty: 'Appears after the first round.',
    },
    {
      title: 'Round time by stage (s)',
      data: 'rounds',
      lines: [
        { key: 'prefillSeconds', name: 'summaries: prefill' },
        { key: 'decodeSeconds', name: 'summaries: decode' },
        { key: 'voteSeconds', name: 'votes' },
        { key: 'updateSeconds', name: 'update' },
      ],
      stacked: true,
      empty: 'Appears after the first round.',
      off: 'this run was not timed',
    },
  ];
  return (
    <section className="card" aria-label="Charts">
      <h2>Training</h2>
      <div className="charts">
        {specs.map((s) => (
          <Chart key={s.title} spec={s} series={series} />
        ))}
      </div>
    </section>
  );
}
