// The browser side of the inference demo: one GPU, one loaded model, streamed generation.
// (The full app moves this behind a Web Worker; the engine code is the same.)
import { createGpu, type Gpu } from '../gpu/index.ts';
import { loadQwen3WithTokenizer } from '../model/load.ts';
import { urlSource } from '../model/sources.ts';
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

export async function loadDemoModel(onProgress: (fraction: number, text: string) => void): Promise<DemoModel> {
  const manifest = (await (await fetch(new URL('manifest.json', DEMO_MODEL_URL))).json()) as { name: string; files: string[] };
  const source = urlSource(manifest.name, DEMO_MODEL_URL, manifest.files);
  onProgress(0, 'Requesting the GPU');
  const gpu = await createGpu();
  try {
    onProgress(0.05, 'Downloading the bundled demo model');
    const { model, cfg, tokenizer } = await loadQwen3WithTokenizer(gpu, source, {
      onProgress: (p) => onProgress(0.1 + 0.9 * (p.loaded / p.total), `Uploading ${p.tensor}`),
    });
    if (!tokenizer) throw new Error('the demo model has no tokenizer');
    return { gpu, model, cfg, tokenizer, defaults: await samplingDefaults(source), name: manifest.name };
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
