// The browser side of the inference demo: one GPU, one loaded model, streamed generation.
// (The full app moves this behind a Web Worker; the engine code is the same.)
import { createGpu, type Gpu } from '../gpu/index.ts';
import { loadQwen3WithTokenizer } from '../model/load.ts';
import { DEFAULT_HUB_REPO, filesSource, hubSource, urlSource, type DownloadProgress, type ModelSource } from '../model/sources.ts';
import { generate, samplingDefaults, type SamplingOptions } from '../model/generate.ts';
import { TextStreamer, type Qwen3Tokenizer } from '../model/tokenizer.ts';
import type { Qwen3Model } from '../model/qwen3.ts';
import type { Qwen3Config } from '../model/config.ts';

export interface DemoModel {
  gpu: Gpu;
  model: Qwen3Model;
  cfg: Qwen3Config;
  tokenizer: Qwen3Tokenizer;
  defaults: Omit<SamplingOptions, 'seed'>;
  name: string;
}

export const DEMO_MODEL_URL = new URL('tiny-demo/', new URL(import.meta.env.BASE_URL, location.href)).href;

export type ModelChoice = { kind: 'demo' } | { kind: 'hub'; repo: string } | { kind: 'files'; files: File[] };

export { DEFAULT_HUB_REPO };

function mib(n: number): string {
  return `${(n / 2 ** 20).toFixed(1)} MiB`;
}

/** One line for a download: bytes, speed, ETA. */
export function describeDownload(p: DownloadProgress): string {
  const total = p.total ? ` of ${mib(p.total)}` : '';
  const eta = Number.isFinite(p.etaSeconds) ? `, ${Math.ceil(p.etaSeconds)} s left` : '';
  return `Downloading ${p.file}: ${mib(p.loaded)}${total} at ${mib(p.bytesPerSecond)}/s${eta}`;
}

export async function loadModel(choice: ModelChoice, onProgress: (fraction: number, text: string) => void): Promise<DemoModel> {
  let source: ModelSource;
  let name: string;
  if (choice.kind === 'demo') {
    const manifest = (await (await fetch(new URL('manifest.json', DEMO_MODEL_URL))).json()) as { name: string; files: string[] };
    source = urlSource(manifest.name, DEMO_MODEL_URL, manifest.files);
    name = manifest.name;
  } else if (choice.kind === 'hub') {
    source = hubSource(choice.repo, { onProgress: (p) => onProgress(p.total ? 0.05 * (p.loaded / p.total) : 0, describeDownload(p)) });
    name = choice.repo;
  } else {
    source = filesSource(choice.files);
    name = source.name;
  }
  return loadFrom(source, name, onProgress);
}

async function loadFrom(source: ModelSource, name: string, onProgress: (fraction: number, text: string) => void): Promise<DemoModel> {
  onProgress(0, 'Requesting the GPU');
  const gpu = await createGpu();
  try {
    onProgress(0.05, `Reading ${name}`);
    const { model, cfg, tokenizer } = await loadQwen3WithTokenizer(gpu, source, {
      onProgress: (p) => onProgress(0.1 + 0.9 * (p.loaded / p.total), `Uploading ${p.tensor}`),
    });
    if (!tokenizer) throw new Error(`${name} has no tokenizer.json: the checkpoint needs its tokenizer files`);
    return { gpu, model, cfg, tokenizer, defaults: await samplingDefaults(source), name };
  } catch (e) {
    gpu.destroy();
    throw e;
  }
}

export interface GenerationStats {
  promptTokens: number;
  generatedTokens: number;
  tokensPerSecond: number;
}

export async function runGeneration(
  m: DemoModel,
  prompt: string,
  opts: SamplingOptions & { chat: boolean; maxNewTokens: number },
  onText: (text: string, stats: GenerationStats) => void,
  shouldStop: () => boolean,
): Promise<GenerationStats> {
  const text = opts.chat ? m.tokenizer.applyChatTemplate([{ role: 'user', content: prompt }], { addGenerationPrompt: true }) : prompt;
  const ids = m.tokenizer.encode(text);
  if (ids.length === 0) throw new Error('The prompt is empty.');
  const streamer = new TextStreamer(m.tokenizer, { skipSpecial: true });
  const stats: GenerationStats = { promptTokens: ids.length, generatedTokens: 0, tokensPerSecond: 0 };
  let firstAt = 0;
  for await (const [tok] of generate(m.model, [ids], { ...opts, stopIds: m.tokenizer.stopIds })) {
    const now = performance.now();
    if (!firstAt) firstAt = now;
    stats.generatedTokens++;
    stats.tokensPerSecond = stats.generatedTokens > 1 ? (stats.generatedTokens - 1) / ((now - firstAt) / 1000) : 0;
    onText(tok.reason === 'stop' ? '' : streamer.push(tok.id), { ...stats });
    if (shouldStop()) break;
  }
  onText(streamer.flush(), { ...stats });
  return stats;
}
