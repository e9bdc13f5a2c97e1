// bench.html: the suite of bench/suite.ts on this browser's WebGPU, then the peer
// (onnxruntime-web, WebGPU EP) beside our engine on the committed tiny checkpoint (peer-model=4b:
// Qwen3-4B layer shapes, from scripts/peer_checkpoint.py). Options are URL parameters with the CLI's
// flag names (?quick, ?ops=gemv, ?model=none), plus peer=0 to skip the peer, peer-model,
// peer-prompt / peer-steps, and run to start on load. scripts/bench-browser.mjs drives this
// page headless and reads window.spyrlBench.
import type * as OrtModule from 'onnxruntime-web';
import { createGpu, type Gpu } from '../src/gpu/index.ts';
import { loadQwen3 } from '../src/model/load.ts';
import { memorySource } from '../src/model/sources.ts';
import { isCpuAdapter } from '../src/ops/index.ts';
import { formatRatios, type BenchReport } from './measure.ts';
import { PEER_MODELS, benchPeer, presentNames, type Ort } from './peer.ts';
import { SUITE_FLAGS, reportTable, runSuite, suiteOptions } from './suite.ts';

interface PageState {
  done: boolean;
  error?: string;
  report?: BenchReport;
  table?: string;
}

declare global {
  interface Window {
    spyrlBench: PageState;
  }
}

const PAGE_FLAGS = ['peer', 'peer-model', 'peer-prompt', 'peer-steps', 'peer-opt', 'peer-cache', 'run'];
const logEl = document.getElementById('log')!;
const log = (line: string) => {
  logEl.textContent += `${line}\n`;
  console.log(line);
};

function flagValues(params: URLSearchParams): Record<string, string | boolean> {
  const v: Record<string, string | boolean> = {};
  for (const [k, val] of params) {
    if (PAGE_FLAGS.includes(k)) continue;
    v[k] = k in SUITE_FLAGS && (k === 'quick' || k === 'full') ? true : val;
  }
  return v;
}

async function fetchBytes(path: string, make?: string): Promise<Uint8Array> {
  const res = await fetch(new URL(`/${path}`, location.href));
  if (!res.ok)
    throw new Error(
      `peer: fetching /${path} failed (${res.status}); the peer needs the dev server (npm start)` +
        (make ? ` and the files of \`${make}\`` : '') +
        ', or pass peer=0',
    );
  return new Uint8Array(await res.arrayBuffer());
}

/** onnxruntime-web's WebGPU build, its wasm files resolved through Vite (dev and build alike). */
async function loadOrt(): Promise<Ort> {
  const [ort, mjs, wasm] = await Promise.all([
    import('onnxruntime-web/webgpu'),
    import('onnxruntime-web/ort-wasm-simd-threaded.asyncify.mjs?url'),
    import('onnxruntime-web/ort-wasm-simd-threaded.asyncify.wasm?url'),
  ]);
  ort.env.wasm.wasmPaths = {
    mjs: new URL(mjs.default, location.href).href,
    wasm: new URL(wasm.default, location.href).href,
  };
  ort.env.wasm.numThreads = 1;
  return ort as unknown as Ort;
}

async function runPeer(gpu: Gpu, report: BenchReport, params: URLSearchParams): Promise<void> {
  const cpu = isCpuAdapter(gpu);
  const prompt = Number(params.get('peer-prompt') ?? (cpu ? 32 : 128));
  const steps = Number(params.get('peer-steps') ?? (cpu ? 8 : 32));
  const which = params.get('peer-model') ?? 'tiny';
  const peerFiles = PEER_MODELS[which];
  if (!peerFiles)
    throw new Error(`peer: unknown peer-model '${which}' (known: ${Object.keys(PEER_MODELS).join(', ')})`);
  log(
    `## peer: onnxruntime-web (WebGPU EP) on ${peerFiles.checkpoint} (exported by scripts/export_onnx.py), prompt ${prompt}, ${steps} decode steps`,
  );
  const files = new Map<string, Uint8Array | string>();
  for (const f of ['config.json', 'model.safetensors'])
    files.set(f, await fetchBytes(`${peerFiles.checkpoint}/${f}`, peerFiles.make));
  const { model, cfg } = await loadQwen3(gpu, memorySource('peer', files));
  const ort = await loadOrt();
  // The cache stays on the GPU between decode steps (peer-cache=cpu: round-trips it through the CPU).
  const cacheOn: OrtModule.Tensor.DataLocation = params.get('peer-cache') === 'cpu' ? 'cpu' : 'gpu-buffer';
  const preferredOutputLocation = Object.fromEntries(presentNames(cfg).map((n) => [n, cacheOn]));
  const onnx = await fetchBytes(peerFiles.onnx, peerFiles.make);
  // ORT's full graph optimization may fail on some graphs with the WebGPU EP ("transformer_memcpy ...
  // node_provider_type.empty()"): then the next level down, said in the log and the report.
  const levels = (params.get('peer-opt') ?? 'all,extended,basic').split(',') as (
    'all' | 'extended' | 'basic' | 'disabled'
  )[];
  let session: OrtModule.InferenceSession | null = null;
  for (const graphOptimizationLevel of levels) {
    try {
      session = await ort.InferenceSession.create(onnx, {
        executionProviders: ['webgpu'],
        preferredOutputLocation,
        graphOptimizationLevel,
      });
      log(`   onnxruntime-web session: WebGPU EP, graphOptimizationLevel '${graphOptimizationLevel}'`);
      report.peerSession = `onnxruntime-web ${ort.env.versions.web ?? ''} webgpu, graphOptimizationLevel ${graphOptimizationLevel}, KV cache on ${cacheOn}`;
      break;
    } catch (e) {
      log(
        `   onnxruntime-web session with graphOptimizationLevel '${graphOptimizationLevel}' failed: ${(e as Error).message.slice(0, 200)}`,
      );
    }
  }
  if (!session) throw new Error(`peer: no onnxruntime-web WebGPU session could be made (levels ${levels.join(', ')})`);
  try {
    const { records, ratios, logitsRelDiff } = await benchPeer(gpu, ort, session, model, {
      prompt,
      steps,
      reps: cpu ? 2 : 5,
      ep: 'webgpu',
    });
    log(`   logits, ours vs onnxruntime-web: max|diff| / max|logit| = ${logitsRelDiff.toExponential(2)}`);
    report.records.push(...records);
    report.ratios = ratios;
    report.peerLogitsRelDiff = logitsRelDiff;
    log(formatRatios(ratios.map((r) => ({ ...r, name: `${r.name} (ours / onnxruntime-web)` }))));
  } finally {
    await session.release();
  }
}

async function run(): Promise<void> {
  const params = new URLSearchParams(location.search);
  window.spyrlBench = { done: false };
  logEl.textContent = '';
  let gpu: Gpu | null = null;
  try {
    gpu = await createGpu();
    const opts = suiteOptions(flagValues(params), isCpuAdapter(gpu));
    if (opts.parts.includes('round'))
      log('# parts=round runs in Node only (npm run bench -- --parts round): skipped here');
    const report = await runSuite(gpu, opts, navigator.userAgent, log);
    if (params.get('peer') !== '0') await runPeer(gpu, report, params);
    const table =
      reportTable(report) +
      (report.ratios
        ? `\n\npeer (ratio = ours / onnxruntime-web, > 1: ours faster)\n${formatRatios(report.ratios)}`
        : '');
    log(`\n${table}`);
    window.spyrlBench = { done: true, report, table };
  } catch (e) {
    const err = e as Error;
    log(`bench failed: ${err.name}: ${err.message}`);
    window.spyrlBench = { done: true, error: `${err.name}: ${err.message}` };
  } finally {
    gpu?.destroy();
  }
}

window.spyrlBench = { done: false };
const startButton = document.getElementById('start') as HTMLButtonElement;
const auto = document.getElementById('auto') as HTMLInputElement;
startButton.addEventListener('click', () => {
  startButton.disabled = true;
  void run().finally(() => {
    startButton.disabled = false;
  });
});
auto.checked = new URLSearchParams(location.search).has('run');
if (auto.checked) startButton.click();
