// KV-cache byte arithmetic, pure (no GPU): what KVCache (src/model/kvCache.ts) allocates, for the
// memory plan and the UI.
import { kvPoolBytes } from '../ops/common.ts';
import type { Qwen3Config } from './config.ts';

export type KvDtype = 'f32' | 'f16';

/**
 * Tokens per page. 16: a borrower re-prefills at most 15 tokens of a shared prefix and a
 * sequence wastes at most 15 positions of its last page, while the page table stays small
 * (2,560 u32 per slot at 40,960 positions); the kernels look a page up once per key, so P does
 * not change their cost.
 */
export const KV_PAGE_SIZE = 16;

/** Pages that hold `tokens` positions of one sequence. */
export function kvPages(tokens: number, pageSize = KV_PAGE_SIZE): number {
  return Math.ceil(tokens / pageSize);
}

/**
 * GPU bytes of a KV cache exactly as KVCache allocates them: K and V pools of every layer for
 * `pages` pages (or the pages of `tokens` positions of one sequence), plus the page table when
 * `slots` and `maxT` are given.
 */
export function kvCacheBytes(
  cfg: Pick<Qwen3Config, 'numLayers' | 'numKvHeads' | 'headDim'>,
  opts: { dtype: KvDtype; pageSize?: number; pages?: number; tokens?: number; slots?: number; maxT?: number },
): number {
  const pageSize = opts.pageSize ?? KV_PAGE_SIZE;
  if ((opts.pages === undefined) === (opts.tokens === undefined))
    throw new RangeError('kvCacheBytes: give exactly one of pages or tokens');
  const pages = opts.pages ?? kvPages(opts.tokens!, pageSize);
  const pools = 2 * cfg.numLayers * kvPoolBytes({ dtype: opts.dtype, pageSize, pages }, cfg.numKvHeads, cfg.headDim);
  const table =
    opts.slots !== undefined && opts.maxT !== undefined ? pageTableBytes(opts.slots, opts.maxT, pageSize) : 0;
  return pools + table;
}

/** Bytes of the page table (S, ceil(maxT / P)) u32. */
export function pageTableBytes(slots: number, maxT: number, pageSize = KV_PAGE_SIZE): number {
  return Math.max(1, slots * kvPages(maxT, pageSize)) * 4;
}
