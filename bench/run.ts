// `npm run bench -- [--quick|--full] [--parts roofline,ops,e2e,round] [--ops gemv,gemm,attention,decode-attention]
//                   [--model tiny,4b] [--weights bf16,q4] [--kv f32,f16] [--layers N,...] [--prompt 128] [--decode 16]
//                   [--batch 1,4] [--train-len N] [--lora-r 16] [--rounds 2] [--gpu-memory G] [--prefill-chunk N] [--mlp-chunk N] [--kernels k=v,...]
//                   [--json FILE]`
// The suite of bench/suite.ts on Node (Dawn, the npm `webgpu` package): progress lines while it
// runs, then the table, and the report as JSON with --json. A benchmark, not a test: nothing here
// asserts a time. `npm run bench:browser` runs the same suite in Chromium.
// First: XDG_RUNTIME_DIR and the SwiftShader fallback, before the GPU module loads.
import '../bin/gpu-env.mjs';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createGpu } from '../src/gpu/index.ts';
import { isCpuAdapter } from '../src/ops/index.ts';
import { SUITE_FLAGS, applyKernels, reportTable, runSuite, suiteOptions } from './suite.ts';

const flagOptions = Object.fromEntries(
  Object.keys(SUITE_FLAGS).map((name) => [
    name,
    { type: name === 'quick' || name === 'full' ? ('boolean' as const) : ('string' as const) },
  ]),
);
const { values } = parseArgs({ options: { ...flagOptions, json: { type: 'string' }, help: { type: 'boolean' } } });
if (values.help) {
  console.log(
    'npm run bench -- [flags]\n' +
      Object.entries(SUITE_FLAGS)
        .map(([k, v]) => `  --${k.padEnd(10)} ${v}`)
        .join('\n') +
      '\n  --json FILE  write the report as JSON',
  );
  process.exit(0);
}
const { json, help: _help, ...flags } = values;

const gpu = await createGpu();
try {
  const opts = suiteOptions(flags, isCpuAdapter(gpu));
  const log = (line: string) => console.log(line);
  const report = await runSuite(gpu, opts, `node ${process.version} (Dawn)`, log);
  if (opts.parts.includes('round')) {
    const { benchRound } = await import('./round.node.ts');
    const restore = applyKernels(gpu, opts.kernels);
    try {
      for (const name of opts.models) {
        for (const layers of opts.layers ?? [undefined])
          for (const format of opts.weights)
            for (const kv of opts.kv)
              report.records.push(
                ...(await benchRound(gpu, name, {
                  mode: opts.mode,
                  layers,
                  format,
                  kv,
                  rounds: opts.rounds,
                  budgetBytes: opts.gpuMemoryBytes,
                  forwardChunk: opts.prefillChunk,
                  mlpChunk: opts.mlpChunk,
                  log,
                })),
              );
      }
    } finally {
      restore();
    }
  }
  console.log(`\n${reportTable(report)}`);
  if (json) {
    writeFileSync(json, JSON.stringify(report, null, 2) + '\n');
    console.log(`\nreport written to ${json}`);
  }
} finally {
  gpu.destroy();
}
