// One chart of the training curves (src/ui/Charts.tsx): lines, or stacked areas for parts of a
// whole. Its own module so that recharts, with its d3 and redux, is a separate chunk, fetched when
// the first curve has a point.
import { Area, AreaChart, CartesianGrid, Legend, Line, LineChart, Tooltip, XAxis, YAxis } from 'recharts';

const COLORS = ['#3567e6', '#d04a3a', '#2d9d78', '#b07a12'];

export interface ChartPlotProps {
  data: Record<string, number | null>[];
  lines: { key: string; name: string }[];
  domain?: [number, number];
  dots: boolean;
  width: number;
  height: number;
  /** Stack the series as areas (each a part of one total) instead of drawing lines. */
  stacked?: boolean;
}

export function ChartPlot({ data, lines, domain, dots, width, height, stacked }: ChartPlotProps) {
  const Chart = stacked ? AreaChart : LineChart;
  return (
    <Chart width={width} height={height} data={data} margin={{ top: 6, right: 12, bottom: 0, left: -12 }}>
      <CartesianGrid stroke="#e6e9ef" />
      <XAxis
        dataKey="round"
        type="number"
        domain={['dataMin', 'dataMax']}
        allowDecimals={false}
        tick={{ fontSize: 11 }}
      />
      <YAxis
        domain={domain ?? ['auto', 'auto']}
        tick={{ fontSize: 11 }}
        width={48}
        tickFormatter={(v: number) => (Math.abs(v) >= 1000 ? v.toExponential(0) : String(+v.toPrecision(3)))}
      />
      <Tooltip
        formatter={(v) => (typeof v === 'number' ? v.toPrecision(4) : String(v))}
        labelFormatter={(l) => `round ${l}`}
      />
      {lines.length > 1 && <Legend wrapperStyle={{ fontSize: 11 }} />}
      {lines.map((l, i) =>
        stacked ? (
          <Area
            key={l.key}
            dataKey={l.key}
            name={l.name}
            stackId="total"
            stroke={COLORS[i]}
            fill={COLORS[i]}
            fillOpacity={0.35}
            dot={dots ? { r: 2 } : false}
            isAnimationActive={false}
          />
        ) : (
          <Line
            key={l.key}
            dataKey={l.key}
            name={l.name}
            stroke={COLORS[i]}
            strokeWidth={2}
            dot={dots ? { r: 2.5 } : false}
            isAnimationActive={false}
          />
        ),
      )}
    </Chart>
  );
}
