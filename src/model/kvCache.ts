// The paged KV cache (docs/ENGINE.md, "KV cache"). Per layer a K pool and a V pool of physical
// pages of P tokens; one page table (S, pagesPerSlot) maps each slot's positions to pages. Pages
// are handed out when a forward first writes a position (the CPU knows every token's slot and
// position before encoding), so memory follows the tokens actually held, and `share` maps a
// prefix of one slot into another without copying: N prompts with one common prefix hold it once.
import type { Gpu } from '../gpu/index.ts';
import * as K from '../ops/index.ts';
import type { Qwen3Config } from './config.ts';

import { KV_PAGE_SIZE, kvCacheBytes, kvPages, type KvDtype } from './kvLayout.ts';

export { KV_PAGE_SIZE, kvCacheBytes, kvPages, pageTableBytes, type KvDtype } from './kvLayout.ts';

const UNMAPPED = 0xffffffff;

export interface KvCacheOptions {
  dtype?: KvDtype;
  /** Tokens per page, a power of two (default KV_PAGE_SIZE). */
  pageSize?: number;
  /** Physical pages (the memory); default slots * ceil(maxT / pageSize), enough for every position. */
  pages?: number;
}

/** Per-layer K and V page pools, (pages, P, NKV, HD) f32 or f16 pairs, and the page table. */
export class KVCache {
  readonly k: GPUBuffer[] = []; // L x (pages, P, NKV, HD) f32 | f16
  readonly v: GPUBuffer[] = []; // L x (pages, P, NKV, HD) f32 | f16
  readonly pageTable: GPUBuffer; // (S, pagesPerSlot) u32, UNMAPPED where no page
  readonly dtype: KvDtype;
  readonly pageSize: number;
  /** Physical pages in each pool. */
  readonly pages: number;
  readonly pagesPerSlot: number;
  /** GPU bytes held: pools and page table (= kvCacheBytes with the same pages, slots, maxT). */
  readonly bytesAllocated: number;
  private readonly table: Uint32Array; // CPU copy of pageTable
  private readonly refs: Uint32Array; // (pages) slots mapping each page; 0 = free
  private readonly free: number[] = []; // free pages, lowest index on top
  private inUse = 0;
  private dirty = true;
  private destroyed = false;

  constructor(
    private readonly gpu: Gpu,
    readonly cfg: Qwen3Config,
    readonly slots: number,
    readonly maxT: number,
    opts: KvCacheOptions = {},
  ) {
    this.dtype = opts.dtype ?? 'f32';
    this.pageSize = opts.pageSize ?? KV_PAGE_SIZE;
    const P = this.pageSize;
    if (this.dtype !== 'f32' && this.dtype !== 'f16')
      throw new RangeError(`KV cache dtype must be f32 or f16 (got ${String(this.dtype)})`);
    if (!Number.isInteger(P) || P < 1 || (P & (P - 1)) !== 0)
      throw new RangeError(`KV cache page size must be a power of two (got ${P})`);
    if (!Number.isInteger(slots) || slots < 1) throw new RangeError(`KV cache needs at least one slot (got ${slots})`);
    if (!Number.isInteger(maxT) || maxT < 1) throw new RangeError(`KV cache needs maxT >= 1 (got ${maxT})`);
    if (this.dtype === 'f16' && cfg.headDim % 2 !== 0)
      throw new RangeError(`f16 KV cache needs an even head_dim (got ${cfg.headDim})`);
    this.pagesPerSlot = kvPages(maxT, P);
    this.pages = opts.pages ?? slots * this.pagesPerSlot;
    if (!Number.isInteger(this.pages) || this.pages < 1)
      throw new RangeError(`KV cache needs at least one page (got ${this.pages})`);
    const poolBytes = K.kvPoolBytes(this, cfg.numKvHeads, cfg.headDim);
    for (let l = 0; l < cfg.numLayers; l++) {
      this.k.push(gpu.createBuffer(poolBytes, `kCache.${l}`));
      this.v.push(gpu.createBuffer(poolBytes, `vCache.${l}`));
    }
    this.table = new Uint32Array(slots * this.pagesPerSlot).fill(UNMAPPED);
    this.pageTable = gpu.createBuffer(this.table.byteLength, 'kvPageTable');
    this.refs = new Uint32Array(this.pages);
    for (let p = this.pages - 1; p >= 0; p--) this.free.push(p);
    this.bytesAllocated = kvCacheBytes(cfg, { dtype: this.dtype, pageSize: P, pages: this.pages, slots, maxT });
  }

  /** The layout the kernels read (K.kvWrite, K.attention). */
  get paging(): K.KvPaging {
    return {
      dtype: this.dtype,
      pageSize: this.pageSize,
      pages: this.pages,
      pagesPerSlot: this.pagesPerSlot,
      maxT: this.maxT,
    };
  }

  /** Physical pages mapped by at least one slot. */
  get pagesInUse(): number {
    return this.inUse;
  }

  /** KV bytes of the pages in use (what the cache holds, shared pages once). */
  get bytesInUse(): number {
    return kvCacheBytes(this.cfg, { dtype: this.dtype, pageSize: this.pageSize, pages: this.inUse });
  }

  /** Positions of `slot` readable now: mapped pages from 0 on, times P. */
  mappedTokens(slot: number): number {
    this.checkSlot(slot, 'mappedTokens');
    let n = 0;
    while (n < this.pagesPerSlot && this.table[slot * this.pagesPerSlot + n] !== UNMAPPED) n++;
    return n * this.pageSize;
  }

  /**
   * Makes slot `dst` read the first `tokens` positions of slot `src` from src's own pages: every
   * full page is mapped into dst's table, nothing is copied. Returns the positions shared (tokens
   * rounded down to a page); dst prefills from there, so a partial last page is recomputed, never
   * copied. dst must hold none of those positions (resetSlot first), and src must have them mapped.
   */
  share(dst: number, src: number, tokens: number): number {
    this.checkSlot(dst, 'share dst');
    this.checkSlot(src, 'share src');
    if (dst === src) throw new RangeError(`share: slot ${dst} cannot borrow from itself`);
    if (!Number.isInteger(tokens) || tokens < 0 || tokens > this.maxT)
      throw new RangeError(`share: ${tokens} tokens is not in [0, ${this.maxT}]`);
    const row = this.pagesPerSlot;
    const n = Math.floor(tokens / this.pageSize);
    for (let j = 0; j < n; j++) {
      if (this.table[dst * row + j] !== UNMAPPED)
        throw new Error(
          `share: slot ${dst} already holds pages under its first ${tokens} positions; resetSlot(${dst}) first`,
        );
    }
    for (let j = 0; j < n; j++) {
      const page = this.table[src * row + j];
      if (page === UNMAPPED)
        throw new Error(
          `share: slot ${src} has no page for positions ${j * this.pageSize}..${(j + 1) * this.pageSize - 1}`,
        );
      this.table[dst * row + j] = page;
      this.refs[page]++;
    }
    if (n > 0) this.dirty = true;
    return n * this.pageSize;
  }

  /** Distinct pages under the first `tokens` positions of these slots (what reslot would keep). */
  pagesUnder(prefixes: readonly { src: number; tokens: number }[]): number {
    const pages = new Set<number>();
    for (const { src, tokens } of prefixes) {
      this.checkSlot(src, 'pagesUnder');
      for (let j = 0; j < Math.min(this.pagesPerSlot, Math.floor(tokens / this.pageSize)); j++) {
        const page = this.table[src * this.pagesPerSlot + j];
        if (page !== UNMAPPED) pages.add(page);
      }
    }
    return pages.size;
  }

  /**
   * Re-slots the cache in place for a new batch (GpuPolicy's next call, GenerateOptions.keepPromptKv):
   * slot `dst` of each entry maps the first `tokens` positions (whole pages) of slot `src`'s pages as
   * they are now, and every other mapping is dropped; pages no entry keeps return to the free list.
   * Nothing moves on the GPU: the page table changes (uploaded by the next prepareWrite), and the
   * new slots write only past their pages. A slot given twice, a partial page or a position its
   * source has no page for is refused, and the cache is left as it was.
   */
  reslot(assign: readonly { dst: number; src: number; tokens: number }[]): void {
    const row = this.pagesPerSlot,
      P = this.pageSize;
    const table = new Uint32Array(this.table.length).fill(UNMAPPED);
    const seen = new Set<number>();
    for (const { dst, src, tokens } of assign) {
      this.checkSlot(dst, 'reslot dst');
      this.checkSlot(src, 'reslot src');
      if (seen.has(dst)) throw new RangeError(`reslot: slot ${dst} is given twice`);
      seen.add(dst);
      if (!Number.isInteger(tokens) || tokens < 0 || tokens % P !== 0 || tokens > row * P)
        throw new RangeError(
          `reslot: ${tokens} positions is not a number of whole pages of ${P} within the slot's ${row * P}`,
        );
      for (let j = 0; j < tokens / P; j++) {
        const page = this.table[src * row + j];
        if (page === UNMAPPED)
          throw new Error(`reslot: slot ${src} has no page for positions ${j * P}..${(j + 1) * P - 1}`);
        table[dst * row + j] = page;
      }
    }
    this.table.set(table);
    this.refs.fill(0);
    for (const page of table) if (page !== UNMAPPED) this.refs[page]++;
    this.free.length = 0;
    this.inUse = 0;
    for (let p = this.pages - 1; p >= 0; p--) {
      if (this.refs[p] === 0) this.free.push(p);
      else this.inUse++;
    }
    this.dirty = true;
  }

  /** Unmaps every page of `slot`; a page returns to the free list when no slot maps it. */
  resetSlot(slot: number): void {
    this.checkSlot(slot, 'resetSlot');
    const row = this.pagesPerSlot;
    for (let j = 0; j < row; j++) {
      const page = this.table[slot * row + j];
      if (page === UNMAPPED) continue;
      this.table[slot * row + j] = UNMAPPED;
      if (--this.refs[page] === 0) {
        this.free.push(page);
        this.inUse--;
      }
      this.dirty = true;
    }
  }

  /**
   * Before a forward writes these (slot, position) pairs: maps a free page under every position
   * that has none and uploads the page table when it changed. Writing into a page that another
   * slot also maps would corrupt that slot's prefix: it throws instead.
   */
  prepareWrite(slots: ArrayLike<number>, positions: ArrayLike<number>): void {
    const row = this.pagesPerSlot;
    const fresh = new Set<number>(); // page-table entries this call maps
    for (let t = 0; t < slots.length; t++) {
      const s = slots[t],
        p = positions[t];
      if (!Number.isInteger(s) || s < 0 || s >= this.slots)
        throw new RangeError(`slot ${s} at index ${t} is out of range (cache has ${this.slots} slots)`);
      if (!Number.isInteger(p) || p < 0 || p >= this.maxT)
        throw new RangeError(`position ${p} at index ${t} exceeds the KV cache capacity of ${this.maxT} tokens`);
      const e = s * row + Math.floor(p / this.pageSize);
      const page = this.table[e];
      if (page === UNMAPPED) fresh.add(e);
      else if (this.refs[page] > 1)
        throw new Error(
          `KV cache: slot ${s} writes position ${p} into page ${page}, shared with ${this.refs[page] - 1} other slot(s)`,
        );
    }
    // Attention reads every position up to the token's own: those pages must exist after this call.
    const last = new Map<number, number>();
    for (let t = 0; t < slots.length; t++) last.set(slots[t], Math.max(last.get(slots[t]) ?? 0, positions[t]));
    for (const [s, p] of last) {
      for (let j = 0; j <= Math.floor(p / this.pageSize); j++) {
        const e = s * row + j;
        if (this.table[e] === UNMAPPED && !fresh.has(e))
          throw new RangeError(
            `KV cache: slot ${s} writes position ${p}, but positions ${j * this.pageSize}..${(j + 1) * this.pageSize - 1} were never written`,
          );
      }
    }
    if (fresh.size > this.free.length) {
      throw new RangeError(
        `KV cache is out of pages: ${fresh.size} more needed, ${this.free.length} of ${this.pages} pages of ${this.pageSize} tokens free`,
      );
    }
    for (const e of fresh) {
      const page = this.free.pop()!;
      this.table[e] = page;
      this.refs[page] = 1;
      this.inUse++;
      this.dirty = true;
    }
    if (this.dirty) {
      this.gpu.write(this.pageTable, this.table); // ordered after all work encoded so far
      this.dirty = false;
    }
  }

  /** Releases the pools and the page table; a second call does nothing. */
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const b of [...this.k, ...this.v, this.pageTable]) this.gpu.releaseBuffer(b);
    this.k.length = 0;
    this.v.length = 0;
  }

  private checkSlot(slot: number, what: string): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.slots)
      throw new RangeError(`${what}: slot ${slot} is out of range (cache has ${this.slots} slots)`);
  }
}
