// Opening a model folder (and optionally a PEFT adapter) for a command.
import { stat } from 'node:fs/promises';
import { ModelLoadError } from '../model/errors.ts';
import { checkIds, str, tokenList, UsageError, type EngineOptions, type Flags } from './args.ts';

export async function requireDir(dir: string, what = 'model folder'): Promise<void> {
  const s = await stat(dir).catch(() => null);
  if (!s) throw new ModelLoadError(dir, `${what} not found`);
  if (!s.isDirectory()) throw new ModelLoadError(dir, 'is not a folder');
}

export async function openModel(dir: string, adapterDir?: string, engine?: EngineOptions) {
  await requireDir(dir);
  if (adapterDir) await requireDir(adapterDir, 'adapter folder');
  const [{ createGpu }, { nodeFolderSource }, { loadQwen3WithTokenizer }] = await Promise.all([
    import('../gpu/index.ts'), import('../model/sources.node.ts'), import('../model/load.ts'),
  ]);
  const gpu = await createGpu();
  try {
    const loaded = await loadQwen3WithTokenizer(gpu, nodeFolderSource(dir), { weights: engine?.weights, kv: engine?.kv });
    if (adapterDir) {
      const [{ readAdapter }, { LoraAdapter }] = await Promise.all([import('../model/peft.ts'), import('../model/lora.ts')]);
      const { lora, tensors } = await readAdapter(nodeFolderSource(adapterDir), loaded.cfg);
      const adapter = new LoraAdapter(gpu, loaded.cfg, lora);
      adapter.setWeights(tensors);
      loaded.model.lora = adapter;
    }
    return { gpu, ...loaded };
  } catch (e) {
    gpu.destroy();
    throw e;
  }
}

/** Token ids from --tokens or (with the model's tokenizer) --text. */
export function inputIds(f: Flags, tokenizer: { encode(t: string): number[] } | null, dir: string, V: number): number[] {
  const tokensArg = str(f, 'tokens');
  const text = f.text === undefined ? undefined : String(f.text);
  if ((tokensArg === undefined) === (text === undefined)) throw new UsageError('give exactly one of --tokens or --text');
  let ids: number[];
  if (tokensArg !== undefined) ids = tokenList(tokensArg, 'tokens');
  else {
    if (!tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${dir}: --text needs the tokenizer files (or use --tokens)`);
    ids = tokenizer.encode(text!);
    if (ids.length === 0) throw new UsageError('--text encodes to no tokens');
  }
  checkIds(ids, V);
  return ids;
}
