#if defined(SPLIT) || defined(LANES)
enable subgroups;
#endif
// KV cache write and causal attention over the cache (GQA), then the training-path attention;
// with TILED defined, the FlashAttention-2 style query-tiled variant of both (below).
// Two modules from this file: with KV defined (f32 | f16) the cache entries kv_write and
// attention_forward; without it the training entries (attention_forward_lse, attention_backward_*),
// which read k and v (T, NKV, HD) f32 directly. attendKeys (the online softmax) serves both.
//
// Paged cache (docs/ENGINE.md, "KV cache"): per layer one K pool and one V pool of physical pages
// of P = 2^pageShift tokens, (pages, P, NKV, HD), f32 or, with KV == f16, f16 pairs in u32
// (element 2k in the low half). The page table (S, pagesPerSlot) u32 maps token position pos of
// slot s to pool row table[s * pagesPerSlot + pos / P] * P + pos % P; slots sharing a prefix map
// the same pages. Unmapped entries hold 0xffffffff.

#ifdef TILED
// FlashAttention-2 style query-tiled attention (docs/ENGINE.md, "Kernel variants"): the same
// results as this file's other entries (after the #else) attention_forward, attention_forward_lse and
// attention_backward_*, with K/V (and, in the dK/dV pass, Q/dO) read once per tile of rows
// instead of once per row.
//
// Forward and dQ: a workgroup owns ROWS = BQ * HG (query, head) rows: BQ consecutive tokens
// times HG query heads of one GQA group (HG = NH/NKV when that fits, see src/ops/attentionTiled.ts),
// one thread per row. It walks the keys in tiles of BK, each tile of K and V loaded once into
// workgroup memory by all threads and then used by every row: each KV head is read once for all
// the query heads of its group. Each thread keeps its row's running max m and normalizer l in
// registers and accumulates its output row in place (online softmax, no T x T buffer, no
// reductions across threads: the only barriers are the tile loads); the backward keeps its rows
// in function-scope arrays.
// dK/dV: a workgroup owns ROWS keys of one KV head (one thread per key) and walks the
// (query, head) pairs that attend to them in tiles of BK pairs, q and dO rows loaded once per tile.
//
// Defines: HDT (head_dim, a multiple of 4: rows are vec4s), BK (keys or pairs per tile), KV
// (f32 | f16: the paged-cache module, entry attention_tiled; absent: the training module, entries
// attention_tiled_lse, attention_tiled_dq, attention_tiled_dkv), SPLIT (training module, needs
// subgroups: the backward's rows split over SPLIT threads, below). Override ROWS: threads per workgroup.

#include "common/grid.wgsl"

const HDT = {{HDT}}u;  // head_dim
const HV = HDT / 4u;   // vec4s per row
const BK = {{BK}}u;    // keys (forward, dQ) or (query, head) pairs (dK/dV) per tile
const NEG = -3.40282346e38;

override ROWS: u32 = 64u;

struct TiledParams {
  T: u32,
  NH: u32,
  NKV: u32,
  BQ: u32, // tokens per query tile (forward, dQ)
  HG: u32, // query heads per tile, a divisor of NH / NKV
  maxT: u32,
  scale: f32, // 1/sqrt(HD)
  pagesPerSlot: u32,
  pageShift: u32,
  hv: u32, // HDT / 4 as a runtime loop bound: not unrolled (SwiftShader compiles unrolled loops slowly)
}

@group(0) @binding(0) var<uniform> p: TiledParams;

var<workgroup> ks: array<vec4<f32>, BK * HV>; // forward, dQ: K tile; dK/dV: q tile
var<workgroup> vs: array<vec4<f32>, BK * HV>; // forward, dQ: V tile; dK/dV: dO tile

// The forward reads a thread's query row and accumulates its output row in place in global
// memory (once per key tile), not in function-scope arrays: SwiftShader keeps such arrays in
// memory anyway (measured the same speed there, within noise, and a faster pipeline compile).
var<private> gRow: u32; // forward: the thread's row t * NH + h of q and out

// The (query, head) row of thread lid in query tile `tile` of head group `hgi`; valid when tok < T.
struct QueryRow {
  tok: u32,
  head: u32,
  kvh: u32,
  valid: bool,
}

fn queryRow(wg: u32, lid: u32) -> QueryRow {
  let G = p.NH / p.NKV;
  let groups = p.NKV * (G / p.HG); // workgroups per query tile
  let tile = wg / groups;
  let hgi = wg - tile * groups;
  let kvh = hgi / (G / p.HG);
  let qi = lid / p.HG;
  let tok = tile * p.BQ + qi;
  let head = kvh * G + (hgi - kvh * (G / p.HG)) * p.HG + (lid - qi * p.HG);
  return QueryRow(tok, head, kvh, qi < p.BQ && tok < p.T);
}

// Query tiles times head groups: the workgroup count of attention_tiled(_lse) and _dq.
fn queryGroups() -> u32 {
  let G = p.NH / p.NKV;
  return ((p.T + p.BQ - 1u) / p.BQ) * p.NKV * (G / p.HG);
}

// scale * q[gRow] . row u of ks.
fn scoreKs(u: u32) -> f32 {
  var s = vec4<f32>(0.0);
  for (var c = 0u; c < p.hv; c++) { s += q[gRow * HV + c] * ks[u * HV + c]; }
  return (s.x + s.y + s.z + s.w) * p.scale;
}

// The first token of the query tile of workgroup wg (uniform: from the workgroup id only).
fn tileStart(wg: u32) -> u32 {
  let G = p.NH / p.NKV;
  return (wg / (p.NKV * (G / p.HG))) * p.BQ;
}

// Online softmax over keys j0 .. j0 + nb - 1 of the tile in ks/vs for the thread's row gRow:
// folds them into m, l and the unnormalized output in out[gRow]. Keys past the row's own count
// are never passed in.
var<private> m: f32;
var<private> l: f32;
var<private> sc: array<f32, BK>;

#ifdef TREE
// Define TREE (training module): the sequence is a packed prefix tree (src/train/packing.ts), its
// branches laid out depth-first after their shared prefix. Key j is visible to the queries t with
// j <= t < keyEnd[j] (the end of the subtree j belongs to): its own branch and the branches below
// it, never a sibling's. Without TREE every key is visible to every later query (keyEnd = T).
var<workgroup> kEndTile: array<u32, BK>; // forward, dQ: keyEnd of the tile's keys
var<private> gTok: u32;                   // forward: the thread's query token
fn keyVisible(u: u32) -> bool { return gTok < kEndTile[u]; }

// Tiles no query of a workgroup sees are skipped, loads and products: in a packed round (the
// civilians' branch, then the spy's) every query of one branch would otherwise walk every key of
// the branches before it.
var<workgroup> endMax: u32;
var<workgroup> endMaxAtomic: atomic<u32>;

// Forward and dQ: whether key tile j0 .. j0 + n - 1, its keyEnd in kEndTile (the caller's load),
// is seen by a query of the workgroup's tile from t0 on (uniform). A tile reaching t0 is (every
// query sees itself); an earlier key only when its subtree reaches t0: never a sibling branch's.
fn treeTileSeen(j0: u32, n: u32, t0: u32, lid: u32) -> bool {
  if (j0 + n > t0) { return true; }
  workgroupBarrier(); // kEndTile in
  if (lid == 0u) {
    var e = 0u;
    for (var u = 0u; u < n; u++) { e = max(e, kEndTile[u]); }
    endMax = e;
  }
  return workgroupUniformLoad(&endMax) > t0;
}

// dK/dV: one past the last query that sees any of the workgroup's keys, from each thread's end
// (the keyEnd of its keys, 0 for none); the pairs from there on are skipped (uniform).
fn treeKeysEnd(end: u32, lid: u32) -> u32 {
  atomicMax(&endMaxAtomic, end); // workgroup memory starts zeroed
  workgroupBarrier();
  if (lid == 0u) { endMax = atomicLoad(&endMaxAtomic); }
  return workgroupUniformLoad(&endMax);
}
#else
fn keyVisible(u: u32) -> bool { return true; }
#endif

fn attendTile(nb: u32) {
  var mt = m;
  for (var u = 0u; u < nb; u++) {
    let s = scoreKs(u);
    sc[u] = s;
    if (keyVisible(u)) { mt = max(mt, s); }
  }
  let corr = exp(m - mt);
  var lt = 0.0;
  for (var u = 0u; u < nb; u++) {
    let e = select(0.0, exp(sc[u] - mt), keyVisible(u)); // a hidden key weighs exactly 0
    sc[u] = e;
    lt += e;
  }
  l = l * corr + lt;
  for (var c = 0u; c < p.hv; c++) {
    var a = out[gRow * HV + c] * corr;
    for (var u = 0u; u < nb; u++) { a += sc[u] * vs[u * HV + c]; }
    out[gRow * HV + c] = a;
  }
  m = mt;
}

// Only for a valid row: out[row] is its accumulator.
fn startRow(row: u32) {
  gRow = row;
  m = NEG;
  l = 0.0;
  for (var c = 0u; c < p.hv; c++) { out[row * HV + c] = vec4<f32>(0.0); }
}

@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>; // (T, NH, HD) f32
@group(0) @binding(2) var<storage, read> q: array<vec4<f32>>;         // (T, NH, HD) f32

fn storeOut() {
  for (var c = 0u; c < p.hv; c++) { out[gRow * HV + c] = out[gRow * HV + c] / l; }
}

#ifdef BLOCKED
// ---- BLOCKED: the forward as register-tiled products (attention_blocked_lse, attention_blocked) -
// The same results as attention_tiled_lse (out and lse = log sum_j exp(scale q.k_j) over the
// visible keys) and attention_tiled (the paged cache), computed the way the tiled GEMM computes a
// product (shaders/matmul.wgsl) instead of one thread per row: a workgroup owns RB = 16 * RI
// (query, head) rows (BQ tokens times HG query heads of one GQA group, as the tiled kernels) and
// walks the keys in tiles of BKB = 8 * KJ.
// Its 128 threads form a 16 x 8 grid (tr, tc), and each holds a register block of each product:
// - S = scale Q K^T: rows tr + 16 i (i < RI) times keys tc + 8 j (j < KJ), summed over the head
//   dim in chunks of DC, the chunk's Q rows and K rows staged in workgroup memory (rows padded by a
//   vec4: the 8 threads of a row group read 8 different bank groups);
// - the online softmax: each row's running max m and sum l, kept by the 8 threads of its row group
//   alike, from the per-thread partial maxima and sums of the tile in workgroup memory;
// - O += P V: the same rows times head-dim vec4s tc + 8 c (c < HV / 8), P and the V tile in
//   workgroup memory, the output block in registers for the whole key walk, written once.
// Each inner loop loads RI + KJ (S) or RI + HC (O) operands per RI * KJ dot4s or RI * HC vec4
// multiply-adds: at RI = KJ = HC = 4, 8 loads per 64 FMAs, where the row kernels load one per 4.
// Defines: RI, KJ, DC (a multiple of 4 dividing HDT); HDT a multiple of 32
// (src/ops/attentionTiled.ts attentionBlocking picks them).
const RI = {{RI}}u;
const KJ = {{KJ}}u;
const DC = {{DC}}u;
const RB = 16u * RI;         // rows a workgroup
const BKB = 8u * KJ;         // keys a tile
const DCV = DC / 4u;         // vec4s of a chunk
const QST = DCV + 1u;        // staged row stride (vec4s), padded
const HC = HV / 8u;          // output vec4s a thread holds per row
const PST = BKB + 1u;        // P row stride (floats), padded
const AREA = max((RB + BKB) * QST, BKB * HV);

// The Q and K chunks (S), then the V tile (O): one region, used in turn.
var<workgroup> stage: array<vec4<f32>, AREA>;
var<workgroup> pTile: array<f32, RB * PST>;  // probabilities of the tile
var<workgroup> partMax: array<f32, RB * 8u>; // per row, each column thread's max over its keys
var<workgroup> partSum: array<f32, RB * 8u>; // ... and its sum of probabilities

// The thread's rows (tr + 16 i), their running max and sum, and its block of their output.
var<private> bTr: u32;
var<private> bTc: u32;
var<private> bTok: array<u32, RI>;  // the row's token (its row of q and out: bRow)
var<private> bRow: array<u32, RI>;
var<private> bOk: array<bool, RI>;
var<private> bM: array<f32, RI>;
var<private> bL: array<f32, RI>;
var<private> bAcc: array<vec4<f32>, RI * HC>;

fn blockedRows(wg: u32, lid: u32) {
  bTr = lid / 8u;
  bTc = lid - bTr * 8u;
  for (var i = 0u; i < RI; i++) {
    let r = queryRow(wg, bTr + 16u * i);
    bTok[i] = r.tok;
    bRow[i] = r.tok * p.NH + r.head;
    bOk[i] = r.valid;
    bM[i] = NEG;
    bL[i] = 0.0;
  }
  for (var e = 0u; e < RI * HC; e++) { bAcc[e] = vec4<f32>(0.0); }
}

// Keys j0 .. min(j0 + BKB, nk) - 1 of KV head kvh into every row: S by chunks, the online
// softmax, O += P V. The module gives keyVec / valueVec (a key's or value's vec4 c) and
// blockVisible (row i sees key j, tile index u; TREE: kEndTile, loaded by the caller).
fn blockedTile(wg: u32, lid: u32, j0: u32, nk: u32, kvh: u32) {
  let tr = bTr;
  let tc = bTc;
  var s: array<f32, RI * KJ>;
  for (var e = 0u; e < RI * KJ; e++) { s[e] = 0.0; }
  for (var c0 = 0u; c0 < HV; c0 += DCV) {
    for (var e = lid; e < (RB + BKB) * DCV; e += 128u) {
      let rr = e / DCV;
      let c = e - rr * DCV;
      var x = vec4<f32>(0.0);
      if (rr < RB) {
        let r = queryRow(wg, rr);
        if (r.valid) { x = q[(r.tok * p.NH + r.head) * HV + c0 + c]; }
      } else {
        let j = j0 + rr - RB;
        if (j < nk) { x = keyVec(j, kvh, c0 + c); }
      }
      stage[rr * QST + c] = x;
    }
    workgroupBarrier();
    for (var c = 0u; c < DCV; c++) {
      var kv: array<vec4<f32>, KJ>;
      for (var j = 0u; j < KJ; j++) { kv[j] = stage[(RB + tc + 8u * j) * QST + c]; }
      for (var i = 0u; i < RI; i++) {
        let qv = stage[(tr + 16u * i) * QST + c];
        for (var j = 0u; j < KJ; j++) { s[i * KJ + j] += dot(qv, kv[j]); }
      }
    }
    workgroupBarrier(); // the chunk is consumed before the next (or the V tile) overwrites it
  }
  // The V tile into the same region.
  for (var e = lid; e < BKB * HV; e += 128u) {
    let u = e / HV;
    let j = j0 + u;
    var x = vec4<f32>(0.0); // zero past the keys: 0 * x must stay 0
    if (j < nk) { x = valueVec(j, kvh, e - u * HV); }
    stage[e] = x;
  }
  workgroupBarrier();
  // Masked scores and each row's partial max over the thread's keys.
  for (var i = 0u; i < RI; i++) {
    var pm = NEG;
    for (var j = 0u; j < KJ; j++) {
      let u = tc + 8u * j;
      let vis = bOk[i] && j0 + u < nk && blockVisible(i, j0 + u, u);
      let x = select(NEG, s[i * KJ + j] * p.scale, vis);
      s[i * KJ + j] = x;
      pm = max(pm, x);
    }
    partMax[(tr + 16u * i) * 8u + tc] = pm;
  }
  workgroupBarrier();
  var corr: array<f32, RI>;
  for (var i = 0u; i < RI; i++) {
    let row = tr + 16u * i;
    var mt = bM[i];
    for (var c = 0u; c < 8u; c++) { mt = max(mt, partMax[row * 8u + c]); }
    var ps = 0.0;
    for (var j = 0u; j < KJ; j++) {
      let x = s[i * KJ + j];
      let e = select(0.0, exp(x - mt), x > NEG); // a hidden key weighs exactly 0
      pTile[row * PST + tc + 8u * j] = e;
      ps += e;
    }
    partSum[row * 8u + tc] = ps;
    corr[i] = exp(bM[i] - mt);
    bM[i] = mt;
  }
  workgroupBarrier();
  // l, then O = O * corr + P V over the tile's keys.
  for (var i = 0u; i < RI; i++) {
    let row = tr + 16u * i;
    var ls = 0.0;
    for (var c = 0u; c < 8u; c++) { ls += partSum[row * 8u + c]; }
    bL[i] = bL[i] * corr[i] + ls;
    for (var c = 0u; c < HC; c++) { bAcc[i * HC + c] *= corr[i]; }
  }
  let nb = min(BKB, nk - j0);
  for (var u = 0u; u < nb; u++) {
    var vv: array<vec4<f32>, HC>;
    for (var c = 0u; c < HC; c++) { vv[c] = stage[u * HV + tc + 8u * c]; }
    for (var i = 0u; i < RI; i++) {
      let pr = pTile[(tr + 16u * i) * PST + u];
      for (var c = 0u; c < HC; c++) { bAcc[i * HC + c] += pr * vv[c]; }
    }
  }
  workgroupBarrier(); // the tile is consumed before the next one's Q/K chunks overwrite it
}

// out = O / l for the valid rows (a row that saw no key is not valid: every query sees itself).
fn blockedStoreOut() {
  for (var i = 0u; i < RI; i++) {
    if (!bOk[i]) { continue; }
    for (var c = 0u; c < HC; c++) { out[bRow[i] * HV + bTc + 8u * c] = bAcc[i * HC + c] / bL[i]; }
  }
}
#endif

#if defined(KV)
#if KV == f16
alias KvWord = vec2<u32>; // four f16 elements
#else
alias KvWord = vec4<f32>;
#endif
@group(0) @binding(3) var<storage, read> kCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(4) var<storage, read> vCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(5) var<storage, read> pageTable: array<u32>; // (S, pagesPerSlot) u32
@group(0) @binding(6) var<storage, read> slot: array<u32>;      // (T) u32
@group(0) @binding(7) var<storage, read> pos: array<u32>;       // (T) u32

fn widen(w: KvWord) -> vec4<f32> {
#if KV == f16
  return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
#else
  return w;
#endif
}

// A run of consecutive tokens of the tile with the same slot: they share the slot's key tiles.
var<workgroup> runEnd: u32;  // tile index one past the run
var<workgroup> runKeys: u32; // keys of the run: max over its tokens of min(pos + 1, maxT)
var<workgroup> runSlot: u32;

// Thread 0: the run of the tile's tokens t0 + start .. with start's slot into runEnd, runKeys,
// runSlot (the caller reads them with workgroupUniformLoad).
fn findRun(t0: u32, start: u32, tileQ: u32) {
  let s = slot[t0 + start];
  var e = start + 1u;
  var n = min(pos[t0 + start] + 1u, p.maxT);
  while (e < tileQ && slot[t0 + e] == s) {
    n = max(n, min(pos[t0 + e] + 1u, p.maxT));
    e++;
  }
  runEnd = e;
  runKeys = n;
  runSlot = s;
}

// ---- attention_tiled: prefill over the paged cache ------------------------------------------
// Token t attends to positions 0..pos[t] of slot[t]. A chunk may hold tokens of several slots:
// a tile walks its runs of equal slots one after the other (thread 0 finds each run), so a tile
// never reads one slot's keys for another's queries; within a run each query masks by its own pos.
@compute @workgroup_size(ROWS)
fn attention_tiled(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  let r = queryRow(wg, lid);
  let t0 = tileStart(wg);
  let tileQ = min(p.BQ, p.T - t0);
  var myKeys = 0u;
  if (r.valid) {
    startRow(r.tok * p.NH + r.head);
    myKeys = min(pos[r.tok] + 1u, p.maxT);
  }
  let rowWords = p.NKV * HV; // vec4s per cached token
  var start = 0u;
  loop {
    if (lid == 0u) { findRun(t0, start, tileQ); }
    let end = workgroupUniformLoad(&runEnd);
    let nk = workgroupUniformLoad(&runKeys);
    let tableRow = workgroupUniformLoad(&runSlot) * p.pagesPerSlot;
    let qi = lid / p.HG;
    let mine = r.valid && qi >= start && qi < end;
    for (var j0 = 0u; j0 < nk; j0 += BK) {
      for (var e = lid; e < BK * HV; e += ROWS) {
        let u = e / HV;
        let j = j0 + u;
        if (j < nk) {
          let page = pageTable[tableRow + (j >> p.pageShift)];
          let at = ((page << p.pageShift) + (j & ((1u << p.pageShift) - 1u))) * rowWords + r.kvh * HV + (e - u * HV);
          ks[e] = widen(kCache[at]);
          vs[e] = widen(vCache[at]);
        }
      }
      workgroupBarrier();
      if (mine && j0 < myKeys) { attendTile(min(BK, myKeys - j0)); }
      workgroupBarrier(); // the tile is consumed before the next one overwrites it
    }
    start = end;
    if (start >= tileQ) { break; }
  }
  if (r.valid) { storeOut(); }
}

#ifdef BLOCKED
// ---- attention_blocked: attention_tiled's prefill as register-tiled products ----------------
// The rows of the tile walk its runs of equal slots as attention_tiled does; a run's key tiles
// (the slot's pages) go to every row, and only the run's rows see them, each up to its own pos.
var<private> bQi: array<u32, RI>;   // the row's token within the tile
var<private> bKeys: array<u32, RI>; // keys the row sees: min(pos + 1, maxT)
var<private> bRunLo: u32;           // the run's tokens within the tile, and its page-table row
var<private> bRunHi: u32;
var<private> bTable: u32;

fn pagedAt(j: u32, kvh: u32, c: u32) -> u32 {
  let page = pageTable[bTable + (j >> p.pageShift)];
  return ((page << p.pageShift) + (j & ((1u << p.pageShift) - 1u))) * p.NKV * HV + kvh * HV + c;
}
fn keyVec(j: u32, kvh: u32, c: u32) -> vec4<f32> { return widen(kCache[pagedAt(j, kvh, c)]); }
fn valueVec(j: u32, kvh: u32, c: u32) -> vec4<f32> { return widen(vCache[pagedAt(j, kvh, c)]); }
fn blockVisible(i: u32, j: u32, u: u32) -> bool {
  return bQi[i] >= bRunLo && bQi[i] < bRunHi && j < bKeys[i];
}

@compute @workgroup_size(128)
fn attention_blocked(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                     @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  blockedRows(wg, lid);
  let t0 = tileStart(wg);
  let tileQ = min(p.BQ, p.T - t0);
  let kvh = queryRow(wg, 0u).kvh;
  for (var i = 0u; i < RI; i++) {
    bQi[i] = (bTr + 16u * i) / p.HG;
    bKeys[i] = select(0u, min(pos[min(bTok[i], p.T - 1u)] + 1u, p.maxT), bOk[i]);
  }
  var start = 0u;
  loop {
    if (lid == 0u) { findRun(t0, start, tileQ); }
    let end = workgroupUniformLoad(&runEnd);
    let nk = workgroupUniformLoad(&runKeys);
    bTable = workgroupUniformLoad(&runSlot) * p.pagesPerSlot;
    bRunLo = start;
    bRunHi = end;
    for (var j0 = 0u; j0 < nk; j0 += BKB) { blockedTile(wg, lid, j0, nk, kvh); }
    start = end;
    if (start >= tileQ) { break; }
  }
  blockedStoreOut();
}
#endif
#else
// ---- training path: one causal sequence at positions 0..T-1; k, v (T, NKV, HD) f32 ------------

@group(0) @binding(3) var<storage, read> k: array<vec4<f32>>; // (T, NKV, HD) f32
@group(0) @binding(4) var<storage, read> v: array<vec4<f32>>; // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read_write> lse: array<f32>; // (T, NH) f32
#ifdef TREE
@group(0) @binding(6) var<storage, read> keyEndLse: array<u32>; // (T) u32: the forward's keyEnd
@group(0) @binding(9) var<storage, read> keyEnd: array<u32>;    // (T) u32: the backward's
#endif

// K and V rows j0 .. min(j0 + BK, nk) - 1 of KV head kvh into ks / vs.
fn loadKvTile(j0: u32, nk: u32, kvh: u32, lid: u32) {
  for (var e = lid; e < BK * HV; e += ROWS) {
    let u = e / HV;
    let j = j0 + u;
    if (j < nk) {
      let at = (j * p.NKV + kvh) * HV + (e - u * HV);
      ks[e] = k[at];
      vs[e] = v[at];
    }
  }
}

// As attention_forward_lse: out and lse = log sum_j exp(scale q.k_j), keys 0..t.
@compute @workgroup_size(ROWS)
fn attention_tiled_lse(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                       @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  let r = queryRow(wg, lid);
  let t0 = tileStart(wg);
  let nk = min(p.T, t0 + p.BQ); // keys of the tile's last query
  let row = r.tok * p.NH + r.head;
  if (r.valid) { startRow(row); }
#ifdef TREE
  gTok = r.tok;
#endif
  for (var j0 = 0u; j0 < nk; j0 += BK) {
#ifdef TREE
    for (var u = lid; u < BK; u += ROWS) { if (j0 + u < nk) { kEndTile[u] = keyEndLse[j0 + u]; } }
    if (!treeTileSeen(j0, min(BK, nk - j0), t0, lid)) { continue; }
#endif
    loadKvTile(j0, nk, r.kvh, lid);
    workgroupBarrier();
    if (r.valid && j0 <= r.tok) { attendTile(min(BK, r.tok + 1u - j0)); }
    workgroupBarrier();
  }
  if (r.valid) {
    storeOut();
    lse[row] = m + log(l);
  }
}

// ---- backward (recurrences as in shaders/attention.wgsl): dQ pass, then dK/dV pass ------------
// attention_tiled_dq also writes D_i = dout_i . out_i, which attention_tiled_dkv reads.

@group(0) @binding(1) var<storage, read_write> dq: array<vec4<f32>>;  // (T, NH, HD) f32
@group(0) @binding(1) var<storage, read_write> dk: array<vec4<f32>>;  // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> dout: array<vec4<f32>>;      // (T, NH, HD) f32
@group(0) @binding(6) var<storage, read> lseIn: array<f32>;           // (T, NH) f32
@group(0) @binding(7) var<storage, read_write> rowDot: array<f32>;    // (T, NH) f32: D, written by _dq
@group(0) @binding(7) var<storage, read> rowDotIn: array<f32>;        // (T, NH) f32: D, read by _dkv
@group(0) @binding(8) var<storage, read> outSaved: array<vec4<f32>>;  // (T, NH, HD) f32
@group(0) @binding(8) var<storage, read_write> dv: array<vec4<f32>>;  // (T, NKV, HD) f32

// The backward keeps its rows in function-scope arrays: its accumulators take a product per
// key (dQ) or per pair (dK/dV), which in place in global memory measured ~10-15% slower on
// SwiftShader (alternated A/B, T = 64 and 128), and registers/local memory suit GPUs better.
#ifdef SPLIT
// With SPLIT, SPLIT consecutive threads share a row (one query row in dQ, one key in dK/dV), each
// holding HV / SPLIT of its vec4s: at head_dim 128 that is 4 x 8 vec4s a thread instead of 4 x 32
// (512 floats, past a GPU thread's registers: they would spill to local memory). The row's dot
// products are summed across its threads with subgroupShuffleXor, which needs the SPLIT threads of
// a row in one subgroup: consecutive invocation indices are consecutive subgroup lanes (every
// desktop GPU, SwiftShader and lavapipe; the tests check the results) and the subgroup size is at
// least SPLIT (src/ops/attentionTiled.ts checks subgroupMinSize). The loops over a tile's keys or
// pairs are uniform (masked, not cut short per row), as subgroup operations require.
const SPLITN = {{SPLIT}}u;
#else
const SPLITN = 1u;
#endif
const HVP = HV / SPLITN; // vec4s of a row a thread holds

var<private> qr: array<vec4<f32>, HVP>;   // dQ: the row's scaled query; dK/dV: the key, scaled
var<private> dr: array<vec4<f32>, HVP>;   // dQ: the row's dout; dK/dV: the key's v
var<private> acc: array<vec4<f32>, HVP>;  // dQ: the dq accumulator; dK/dV: dk
var<private> acc2: array<vec4<f32>, HVP>; // dK/dV: the dv accumulator

// The helpers below work on a thread's part of a row: vec4s c0 .. c0 + hs - 1 (the whole row,
// c0 = 0 and hs = p.hv, without SPLIT).

// Query row `row` into qr (scaled) and dr (its dout), acc zeroed; returns the part's dout . out.
fn loadQueryPart(row: u32, c0: u32, hs: u32) -> f32 {
  var s = vec4<f32>(0.0);
  for (var c = 0u; c < hs; c++) {
    qr[c] = q[row * HV + c0 + c] * p.scale;
    dr[c] = dout[row * HV + c0 + c];
    acc[c] = vec4<f32>(0.0);
    s += dr[c] * outSaved[row * HV + c0 + c];
  }
  return s.x + s.y + s.z + s.w;
}

// Key row kr (its first vec4) into qr (scaled k) and dr (v) when valid; acc and acc2 zeroed.
fn loadKeyPart(kr: u32, hs: u32, valid: bool) {
  for (var c = 0u; c < hs; c++) {
    if (valid) {
      qr[c] = k[kr + c] * p.scale;
      dr[c] = v[kr + c];
    }
    acc[c] = vec4<f32>(0.0);
    acc2[c] = vec4<f32>(0.0);
  }
}

// (qr . ks row u, dr . vs row u) over the part.
fn partDots(u: u32, c0: u32, hs: u32) -> vec2<f32> {
  var sp = vec4<f32>(0.0);
  var dp = vec4<f32>(0.0);
  for (var c = 0u; c < hs; c++) {
    sp += qr[c] * ks[u * HV + c0 + c];
    dp += dr[c] * vs[u * HV + c0 + c];
  }
  return vec2<f32>(sp.x + sp.y + sp.z + sp.w, dp.x + dp.y + dp.z + dp.w);
}

// dQ: acc += ds k_u. dK/dV: acc += ds q_u, acc2 += pij dO_u (the tile holds q and dO there).
fn addDq(ds: f32, u: u32, c0: u32, hs: u32) {
  for (var c = 0u; c < hs; c++) { acc[c] += ds * ks[u * HV + c0 + c]; }
}
fn addDkv(ds: f32, pij: f32, u: u32, c0: u32, hs: u32) {
  for (var c = 0u; c < hs; c++) {
    acc[c] += ds * ks[u * HV + c0 + c];
    acc2[c] += pij * vs[u * HV + c0 + c];
  }
}

fn storeDq(row: u32, c0: u32, hs: u32) {
  for (var c = 0u; c < hs; c++) { dq[row * HV + c0 + c] = dq[row * HV + c0 + c] + p.scale * acc[c]; }
}
fn storeDkv(kr: u32, hs: u32) {
  for (var c = 0u; c < hs; c++) {
    dk[kr + c] = dk[kr + c] + p.scale * acc[c];
    dv[kr + c] = dv[kr + c] + acc2[c];
  }
}

var<workgroup> pairLse: array<f32, BK>;
var<workgroup> pairDot: array<f32, BK>;

// The dK/dV pass's tile: pairs e0 .. e0 + BK - 1 of the nPairs (query, head) pairs e = (i - jFirst)
// * G + g of KV head kvh: their q rows into ks, dO rows into vs, lse and D into pairLse / pairDot.
fn loadPairTile(e0: u32, nPairs: u32, jFirst: u32, kvh: u32, G: u32, lid: u32) {
  for (var e = lid; e < BK * HV; e += ROWS) {
    let u = e / HV;
    let pe = e0 + u;
    if (pe < nPairs) {
      let i = jFirst + pe / G;
      let th = i * p.NH + kvh * G + pe % G;
      ks[e] = q[th * HV + (e - u * HV)];
      vs[e] = dout[th * HV + (e - u * HV)];
      if (e - u * HV == 0u) {
        pairLse[u] = lseIn[th];
        pairDot[u] = rowDotIn[th];
      }
    }
  }
}

// One past the last query that sees key j (< T): keyEnd[j] with TREE, else T.
fn keyEndOf(j: u32) -> u32 {
#ifdef TREE
  return keyEnd[j];
#else
  return p.T;
#endif
}

// The (query, head) pairs a dK/dV workgroup walks from its first key jFirst (uniform): up to the
// last query (TREE: the last that sees one of its keys; `end`, each thread's keyEnd of its keys).
fn pairCount(end: u32, jFirst: u32, G: u32, lid: u32) -> u32 {
#ifdef TREE
  return (treeKeysEnd(end, lid) - jFirst) * G;
#else
  return (p.T - jFirst) * G;
#endif
}

#ifndef SPLIT
@compute @workgroup_size(ROWS)
fn attention_tiled_dq(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                      @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  let r = queryRow(wg, lid);
  let t0 = tileStart(wg);
  let nk = min(p.T, t0 + p.BQ);
  let row = r.tok * p.NH + r.head;
  var di = 0.0;
  var lseI = 0.0;
  if (r.valid) {
    di = loadQueryPart(row, 0u, p.hv);
    rowDot[row] = di;
    lseI = lseIn[row];
  }
#ifdef TREE
  gTok = r.tok;
#endif
  for (var j0 = 0u; j0 < nk; j0 += BK) {
#ifdef TREE
    for (var u = lid; u < BK; u += ROWS) { if (j0 + u < nk) { kEndTile[u] = keyEnd[j0 + u]; } }
    if (!treeTileSeen(j0, min(BK, nk - j0), t0, lid)) { continue; }
#endif
    loadKvTile(j0, nk, r.kvh, lid);
    workgroupBarrier();
    if (r.valid && j0 <= r.tok) {
      let nb = min(BK, r.tok + 1u - j0);
      for (var u = 0u; u < nb; u++) {
        if (!keyVisible(u)) { continue; }
        let d = partDots(u, 0u, p.hv);
        let pij = exp(d.x - lseI);
        addDq(pij * (d.y - di), u, 0u, p.hv);
      }
    }
    workgroupBarrier();
  }
  if (r.valid) { storeDq(row, 0u, p.hv); }
}

// One thread per key j of the workgroup's ROWS keys and KV head; pairs e = (i - j0) * G + g over
// queries i >= j0 (the first key) and the G query heads of the KV head, in tiles of BK.
@compute @workgroup_size(ROWS)
fn attention_tiled_dkv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                       @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  let nTiles = (p.T + ROWS - 1u) / ROWS;
  if (wg >= nTiles * p.NKV) { return; }
  let tile = wg / p.NKV;
  let kvh = wg - tile * p.NKV;
  let G = p.NH / p.NKV;
  let jFirst = tile * ROWS;
  let j = jFirst + lid;
  let valid = j < p.T;
  let kr = (j * p.NKV + kvh) * HV;
  loadKeyPart(kr, p.hv, valid);
  // The pairs before this key's first query (i < j) are skipped: e < (j - jFirst) * G.
  let firstPair = (min(j, p.T) - jFirst) * G;
  let keyStop = select(0u, keyEndOf(min(j, p.T - 1u)), valid);
  let endPair = select(0u, (keyStop - jFirst) * G, valid); // and those from its keyEnd on
  let nPairs = pairCount(keyStop, jFirst, G, lid);
  for (var e0 = 0u; e0 < nPairs; e0 += BK) {
    loadPairTile(e0, nPairs, jFirst, kvh, G, lid);
    workgroupBarrier();
    let end = min(BK, nPairs - e0);
    if (valid && e0 + end > firstPair && e0 < endPair) {
      for (var u = select(0u, firstPair - e0, firstPair > e0); u < min(end, endPair - e0); u++) {
        let d = partDots(u, 0u, p.hv);
        let pij = exp(d.x - pairLse[u]);
        addDkv(pij * (d.y - pairDot[u]), pij, u, 0u, p.hv);
      }
    }
    workgroupBarrier();
  }
  if (valid) { storeDkv(kr, p.hv); }
}
#else
// The sum of x over the SPLITN threads of this thread's row (aligned groups of SPLITN lanes).
fn rowSum(x: f32) -> f32 {
  var s = x;
  for (var o = 1u; o < SPLITN; o <<= 1u) { s += subgroupShuffleXor(s, o); }
  return s;
}

@compute @workgroup_size(ROWS)
fn attention_tiled_dq(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                      @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  let r = queryRow(wg, lid / SPLITN); // ROWS / SPLITN rows, SPLITN threads each
  let hs = p.hv / SPLITN;
  let c0 = (lid % SPLITN) * hs; // this thread's first vec4 of the row
  let t0 = tileStart(wg);
  let nk = min(p.T, t0 + p.BQ);
  let row = r.tok * p.NH + r.head;
  var dpart = 0.0;
  var lseI = 0.0;
  if (r.valid) {
    dpart = loadQueryPart(row, c0, hs);
    lseI = lseIn[row];
  }
  let di = rowSum(dpart);
  if (r.valid && c0 == 0u) { rowDot[row] = di; }
#ifdef TREE
  gTok = r.tok;
#endif
  for (var j0 = 0u; j0 < nk; j0 += BK) {
#ifdef TREE
    for (var u = lid; u < BK; u += ROWS) { if (j0 + u < nk) { kEndTile[u] = keyEnd[j0 + u]; } }
    if (!treeTileSeen(j0, min(BK, nk - j0), t0, lid)) { continue; }
#endif
    loadKvTile(j0, nk, r.kvh, lid);
    workgroupBarrier();
    let nb = min(BK, nk - j0);
    for (var u = 0u; u < nb; u++) {
      let d = partDots(u, c0, hs);
      let score = rowSum(d.x);
      let dpi = rowSum(d.y);
      let pij = select(0.0, exp(score - lseI), r.valid && j0 + u <= r.tok && keyVisible(u));
      addDq(pij * (dpi - di), u, c0, hs);
    }
    workgroupBarrier();
  }
  if (r.valid) { storeDq(row, c0, hs); }
}

// One key j per SPLITN threads: the workgroup's ROWS / SPLITN keys of a KV head, and the pairs
// e = (i - j0) * G + g over queries i >= j0 and the G query heads of the KV head, in tiles of BK.
@compute @workgroup_size(ROWS)
fn attention_tiled_dkv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                       @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  let keys = ROWS / SPLITN;
  let nTiles = (p.T + keys - 1u) / keys;
  if (wg >= nTiles * p.NKV) { return; }
  let tile = wg / p.NKV;
  let kvh = wg - tile * p.NKV;
  let G = p.NH / p.NKV;
  let hs = p.hv / SPLITN;
  let c0 = (lid % SPLITN) * hs;
  let jFirst = tile * keys;
  let j = jFirst + lid / SPLITN;
  let valid = j < p.T;
  let kr = (j * p.NKV + kvh) * HV + c0;
  loadKeyPart(kr, hs, valid);
  let firstPair = (min(j, p.T) - jFirst) * G; // this key's first query: pairs before it are masked
  let keyStop = select(0u, keyEndOf(min(j, p.T - 1u)), valid);
  let endPair = select(0u, (keyStop - jFirst) * G, valid); // and those from its keyEnd on
  let nPairs = pairCount(keyStop, jFirst, G, lid);
  for (var e0 = 0u; e0 < nPairs; e0 += BK) {
    loadPairTile(e0, nPairs, jFirst, kvh, G, lid);
    workgroupBarrier();
    let end = min(BK, nPairs - e0);
    for (var u = 0u; u < end; u++) {
      let d = partDots(u, c0, hs);
      let score = rowSum(d.x);
      let dpi = rowSum(d.y);
      let pij = select(0.0, exp(score - pairLse[u]), valid && e0 + u >= firstPair && e0 + u < endPair);
      addDkv(pij * (dpi - pairDot[u]), pij, u, c0, hs);
    }
    workgroupBarrier();
  }
  if (valid) { storeDkv(kr, hs); }
}
#endif

#ifdef BLOCKED
// The training module's keys: k and v rows of KV head kvh; key j seen by query t when j <= t
// (TREE: and t < keyEnd[j], the tile's ends in kEndTile).
fn keyVec(j: u32, kvh: u32, c: u32) -> vec4<f32> { return k[(j * p.NKV + kvh) * HV + c]; }
fn valueVec(j: u32, kvh: u32, c: u32) -> vec4<f32> { return v[(j * p.NKV + kvh) * HV + c]; }
fn blockVisible(i: u32, j: u32, u: u32) -> bool {
#ifdef TREE
  return j <= bTok[i] && bTok[i] < kEndTile[u];
#else
  return j <= bTok[i];
#endif
}

@compute @workgroup_size(128)
fn attention_blocked_lse(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                         @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  blockedRows(wg, lid);
  let t0 = tileStart(wg);
  let nk = min(p.T, t0 + p.BQ); // keys of the tile's last query
  let kvh = queryRow(wg, 0u).kvh;
  for (var j0 = 0u; j0 < nk; j0 += BKB) {
#ifdef TREE
    for (var u = lid; u < BKB; u += 128u) { if (j0 + u < nk) { kEndTile[u] = keyEndLse[j0 + u]; } }
    if (!treeTileSeen(j0, min(BKB, nk - j0), t0, lid)) { continue; }
#endif
    blockedTile(wg, lid, j0, nk, kvh);
  }
  blockedStoreOut();
  for (var i = 0u; i < RI; i++) {
    if (bOk[i] && bTc == 0u) { lse[bRow[i]] = bM[i] + log(bL[i]); }
  }
}

// ---- attention_blocked_dq, attention_blocked_dkv: the backward as register-tiled products -----
// FA-2's backward (as attention_tiled_dq / _dkv: P = exp(scale q.k - lse), dS = P (dO.v - D),
// dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO), each product a register block a thread as
// in attention_blocked_lse. dQ: a workgroup owns 16 RI (query, head) rows, walks 8 KJ-key tiles;
// S and dP = dO V^T over head-dim chunks (Q and K, then dO and V staged), dS through workgroup
// memory, dQ += dS K with the K tile staged. dK/dV: a workgroup owns 16 RI keys of one KV head
// and walks the (query, head) pairs e = (i - first key) * G + g of its GQA group in tiles of
// 8 KJ; S^T = K Q^T and dP^T = V dO^T by chunks, then dV += P^T dO and dK += dS^T Q with the dO,
// then the Q, tile staged. Hidden pairs (i < j; TREE: i >= keyEnd[j]) weigh exactly 0.

// The backward's row operands: a-rows are the workgroup's own rows (dQ: its (query, head) rows;
// dK/dV: its keys jFirst + r), b-rows those of the tile it walks (dQ: keys x0 + u; dK/dV: the
// (query, head) pairs x0 + u, e = (i - jFirst) * G + g). ph 0 reads q / k, ph 1 dO / v.
struct BwdRows {
  wg: u32,
  forKeys: bool, // dK/dV
  x0: u32,       // the tile's first key (dQ) or pair (dK/dV)
  n: u32,        // keys (dQ) or pairs (dK/dV) in all
  jFirst: u32,   // dK/dV: the workgroup's first key
  kvh: u32,
}

// Query-side row `th` (t * NH + head) of q (ph 0) or dO (ph 1); key row j of k or v.
fn queryVec(ph: u32, th: u32, c: u32) -> vec4<f32> {
  if (ph == 0u) { return q[th * HV + c]; }
  return dout[th * HV + c];
}
fn kvVec(ph: u32, j: u32, kvh: u32, c: u32) -> vec4<f32> {
  if (ph == 0u) { return k[(j * p.NKV + kvh) * HV + c]; }
  return v[(j * p.NKV + kvh) * HV + c];
}
// The (query, head) row of pair pe of KV head kvh from key jFirst on.
fn pairRow(pe: u32, jFirst: u32, kvh: u32) -> u32 {
  let G = p.NH / p.NKV;
  return (jFirst + pe / G) * p.NH + kvh * G + pe % G;
}

// Row rr of the staged operands (a-rows below RB, then b-rows), vec4 c; zero past the rows.
fn bwdVec(o: BwdRows, ph: u32, rr: u32, c: u32) -> vec4<f32> {
  if (rr < RB) {
    if (o.forKeys) {
      let j = o.jFirst + rr;
      if (j < p.T) { return kvVec(ph, j, o.kvh, c); }
    } else {
      let r = queryRow(o.wg, rr);
      if (r.valid) { return queryVec(ph, r.tok * p.NH + r.head, c); }
    }
  } else {
    let x = o.x0 + rr - RB;
    if (x < o.n) {
      if (o.forKeys) { return queryVec(ph, pairRow(x, o.jFirst, o.kvh), c); }
      return kvVec(ph, x, o.kvh, c);
    }
  }
  return vec4<f32>(0.0);
}

// The thread's RI x KJ blocks of both products over the head dim, by chunks of DC: bS = a . b
// of q / k (ph 0: S or S^T), blk = a . b of dO / v (ph 1: dP or dP^T).
var<private> bS: array<f32, RI * KJ>;
var<private> blk: array<f32, RI * KJ>;
fn bwdProducts(o: BwdRows, lid: u32) {
  for (var ph = 0u; ph < 2u; ph++) {
    for (var e = 0u; e < RI * KJ; e++) { blk[e] = 0.0; }
    for (var c0 = 0u; c0 < HV; c0 += DCV) {
      for (var e = lid; e < (RB + BKB) * DCV; e += 128u) {
        let rr = e / DCV;
        let c = e - rr * DCV;
        stage[rr * QST + c] = bwdVec(o, ph, rr, c0 + c);
      }
      workgroupBarrier();
      for (var c = 0u; c < DCV; c++) {
        var bv: array<vec4<f32>, KJ>;
        for (var j = 0u; j < KJ; j++) { bv[j] = stage[(RB + bTc + 8u * j) * QST + c]; }
        for (var i = 0u; i < RI; i++) {
          let av = stage[(bTr + 16u * i) * QST + c];
          for (var j = 0u; j < KJ; j++) { blk[i * KJ + j] += dot(av, bv[j]); }
        }
      }
      workgroupBarrier();
    }
    if (ph == 0u) { for (var e = 0u; e < RI * KJ; e++) { bS[e] = blk[e]; } }
  }
}

// The whole b-rows of the tile (ph 0: q or k; 1: dO or v) into the staging region, for the
// products that take them along the head dim (dQ += dS K; dV += P^T dO; dK += dS^T Q).
fn stageTile(o: BwdRows, ph: u32, lid: u32) {
  for (var e = lid; e < BKB * HV; e += 128u) {
    let u = e / HV;
    stage[e] = bwdVec(o, ph, RB + u, e - u * HV);
  }
}

// acc[i][c] += sum over the tile's u < nb of pTile[row i][u] * staged row u (vec4 tc + 8 c).
fn tileTimesStaged(acc: ptr<function, array<vec4<f32>, RI * HC>>, nb: u32) {
  for (var u = 0u; u < nb; u++) {
    var bv: array<vec4<f32>, HC>;
    for (var c = 0u; c < HC; c++) { bv[c] = stage[u * HV + bTc + 8u * c]; }
    for (var i = 0u; i < RI; i++) {
      let w = pTile[(bTr + 16u * i) * PST + u];
      for (var c = 0u; c < HC; c++) { (*acc)[i * HC + c] += w * bv[c]; }
    }
  }
}

@compute @workgroup_size(128)
fn attention_blocked_dq(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                        @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  if (wg >= queryGroups()) { return; }
  blockedRows(wg, lid);
  let t0 = tileStart(wg);
  let nk = min(p.T, t0 + p.BQ);
  let kvh = queryRow(wg, 0u).kvh;
  var lseR: array<f32, RI>;
  var dR: array<f32, RI>;
  var acc: array<vec4<f32>, RI * HC>;
  // D = dO . O per row: each thread's vec4s, then the row group's 8 partial sums.
  for (var i = 0u; i < RI; i++) {
    var s = vec4<f32>(0.0);
    lseR[i] = 0.0;
    if (bOk[i]) {
      for (var c = 0u; c < HC; c++) {
        let at = bRow[i] * HV + bTc + 8u * c;
        s += dout[at] * outSaved[at];
      }
      lseR[i] = lseIn[bRow[i]];
    }
    partSum[(bTr + 16u * i) * 8u + bTc] = s.x + s.y + s.z + s.w;
  }
  for (var e = 0u; e < RI * HC; e++) { acc[e] = vec4<f32>(0.0); }
  workgroupBarrier();
  for (var i = 0u; i < RI; i++) {
    var d = 0.0;
    for (var c = 0u; c < 8u; c++) { d += partSum[(bTr + 16u * i) * 8u + c]; }
    dR[i] = d;
    if (bOk[i] && bTc == 0u) { rowDot[bRow[i]] = d; }
  }

  for (var j0 = 0u; j0 < nk; j0 += BKB) {
#ifdef TREE
    for (var u = lid; u < BKB; u += 128u) { if (j0 + u < nk) { kEndTile[u] = keyEnd[j0 + u]; } }
    if (!treeTileSeen(j0, min(BKB, nk - j0), t0, lid)) { continue; }
#endif
    let o = BwdRows(wg, false, j0, nk, 0u, kvh);
    bwdProducts(o, lid); // S in bS, dP in blk (its barriers publish kEndTile)
    stageTile(o, 0u, lid); // the K tile for dQ += dS K
    for (var i = 0u; i < RI; i++) {
      for (var j = 0u; j < KJ; j++) {
        let u = bTc + 8u * j;
        var vis = bOk[i] && j0 + u <= bTok[i];
#ifdef TREE
        vis = vis && bTok[i] < kEndTile[u];
#endif
        let pij = select(0.0, exp(bS[i * KJ + j] * p.scale - lseR[i]), vis);
        pTile[(bTr + 16u * i) * PST + u] = pij * (blk[i * KJ + j] - dR[i]);
      }
    }
    workgroupBarrier();
    tileTimesStaged(&acc, min(BKB, nk - j0));
    workgroupBarrier();
  }
  for (var i = 0u; i < RI; i++) {
    if (!bOk[i]) { continue; }
    for (var c = 0u; c < HC; c++) {
      let at = bRow[i] * HV + bTc + 8u * c;
      dq[at] = dq[at] + p.scale * acc[i * HC + c];
    }
  }
}

@compute @workgroup_size(128)
fn attention_blocked_dkv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                         @builtin(local_invocation_index) lid: u32) {
  let wg = linearGroup(wid, nwg);
  let nTiles = (p.T + RB - 1u) / RB;
  if (wg >= nTiles * p.NKV) { return; }
  let tile = wg / p.NKV;
  let kvh = wg - tile * p.NKV;
  let G = p.NH / p.NKV;
  let jFirst = tile * RB;
  bTr = lid / 8u;
  bTc = lid - bTr * 8u;
  var key: array<u32, RI>;
  var ok: array<bool, RI>;
  var kEnd: array<u32, RI>;
  var accK: array<vec4<f32>, RI * HC>;
  var accV: array<vec4<f32>, RI * HC>;
  for (var i = 0u; i < RI; i++) {
    let j = jFirst + bTr + 16u * i;
    key[i] = j;
    ok[i] = j < p.T;
    kEnd[i] = select(0u, keyEndOf(min(j, p.T - 1u)), j < p.T);
  }
  for (var e = 0u; e < RI * HC; e++) {
    accK[e] = vec4<f32>(0.0);
    accV[e] = vec4<f32>(0.0);
  }
  var myEnd = 0u;
  for (var i = 0u; i < RI; i++) { myEnd = max(myEnd, kEnd[i]); }
  let nPairs = pairCount(myEnd, jFirst, G, lid);
  for (var e0 = 0u; e0 < nPairs; e0 += BKB) {
    let o = BwdRows(wg, true, e0, nPairs, jFirst, kvh);
    bwdProducts(o, lid); // S^T in bS, dP^T in blk
    // The pairs' lse and D, and their dO tile for dV += P^T dO.
    stageTile(o, 1u, lid);
    for (var u = lid; u < BKB; u += 128u) {
      if (e0 + u < nPairs) {
        let th = pairRow(e0 + u, jFirst, kvh);
        pairLse[u] = lseIn[th];
        pairDot[u] = rowDotIn[th];
      }
    }
    workgroupBarrier();
    // P^T into the tile; dS^T into bS.
    for (var i = 0u; i < RI; i++) {
      for (var j = 0u; j < KJ; j++) {
        let u = bTc + 8u * j;
        let pe = e0 + u;
        let qi = jFirst + pe / G;
        let vis = ok[i] && pe < nPairs && qi >= key[i] && qi < kEnd[i];
        let pij = select(0.0, exp(bS[i * KJ + j] * p.scale - pairLse[u]), vis);
        pTile[(bTr + 16u * i) * PST + u] = pij;
        bS[i * KJ + j] = pij * (blk[i * KJ + j] - pairDot[u]);
      }
    }
    workgroupBarrier();
    let nb = min(BKB, nPairs - e0);
    tileTimesStaged(&accV, nb);
    workgroupBarrier();
    // dS^T into the tile, the pairs' Q tile for dK += dS^T Q.
    for (var i = 0u; i < RI; i++) {
      for (var j = 0u; j < KJ; j++) { pTile[(bTr + 16u * i) * PST + bTc + 8u * j] = bS[i * KJ + j]; }
    }
    stageTile(o, 0u, lid);
    workgroupBarrier();
    tileTimesStaged(&accK, nb);
    workgroupBarrier();
  }
  for (var i = 0u; i < RI; i++) {
    if (!ok[i]) { continue; }
    for (var c = 0u; c < HC; c++) {
      let at = (key[i] * p.NKV + kvh) * HV + bTc + 8u * c;
      dk[at] = dk[at] + p.scale * accK[i * HC + c];
      dv[at] = dv[at] + accV[i * HC + c];
    }
  }
}
#endif
#endif
#else
#include "common/grid.wgsl"

// KvWord, KV_PER_WORD, UNMAPPED; with KV == f16 f16Bits and packKv (shared with rope.wgsl)
#include "common/kvword.wgsl"

#if defined(KV)
// ---- kv_write: cache[slot[t], pos[t], :, :] = k[t] / v[t] (rounded to f16 when KV == f16) ----
// One thread per cache word: in f16 a thread packs both halves of its u32, so no two threads
// ever write halves of one word.

struct KvWriteParams {
  T: u32,
  NKV: u32,
  HD: u32,
  maxT: u32,
  pagesPerSlot: u32,
  pageShift: u32,
}

@group(0) @binding(0) var<uniform> kw: KvWriteParams;
@group(0) @binding(1) var<storage, read_write> kwKCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(2) var<storage, read_write> kwVCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(3) var<storage, read> kwK: array<f32>;            // (T, NKV, HD) f32
@group(0) @binding(4) var<storage, read> kwV: array<f32>;            // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> kwPageTable: array<u32>;    // (S, pagesPerSlot) u32
@group(0) @binding(6) var<storage, read> kwSlot: array<u32>;         // (T) u32
@group(0) @binding(7) var<storage, read> kwPos: array<u32>;          // (T) u32

@compute @workgroup_size(256)
fn kv_write(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
            @builtin(local_invocation_index) lid: u32) {
  let row = kw.NKV * kw.HD / KV_PER_WORD; // words per token
  let i = linearGroup(wid, nwg) * 256u + lid; // word index in (T, row)
  if (i >= kw.T * row) { return; }
  let t = i / row;
  let pt = kwPos[t];
  if (pt >= kw.maxT) { return; } // past capacity: drop rather than spill into another page
  let page = kwPageTable[kwSlot[t] * kw.pagesPerSlot + (pt >> kw.pageShift)];
  if (page == UNMAPPED) { return; }
  let dst = ((page << kw.pageShift) + (pt & ((1u << kw.pageShift) - 1u))) * row + (i - t * row);
#if KV == f16
  kwKCache[dst] = packKv(kwK[2u * i], kwK[2u * i + 1u]);
  kwVCache[dst] = packKv(kwV[2u * i], kwV[2u * i + 1u]);
#else
  kwKCache[dst] = kwK[i];
  kwVCache[dst] = kwV[i];
#endif
}
#endif

// ---- attention: one workgroup per (token, head), online softmax over key blocks -------------
// Token t's query attends to positions 0..pos[t] of cache slot slot[t] (causal by position), so
// prefill (one slot, pos 0..T-1) and batched decode (one token per slot) are the same kernel.
// No (T, T, NH) score buffer: each block of BLK keys is scored, folded into a running max m,
// normalizer l and output accumulator, then discarded. K and V are read back to f32 and all
// arithmetic is f32 whatever the cache's element type.

struct AttentionParams {
  T: u32,
  NH: u32,
  NKV: u32,
  HD: u32,
  maxT: u32,
  scale: f32, // 1/sqrt(HD)
#if defined(KV)
  pagesPerSlot: u32,
  pageShift: u32,
  splitKeys: u32, // attention_split: keys per split (a multiple of BLK)
  splits: u32,    // attention_split / attention_combine: splits per (token, head)
#endif
#ifdef APART
  aR: u32, // attention_combine with define APART: rows of aA
#endif
}

const BLK = 64u;   // keys per block = threads per workgroup
const HDMAX = 256u;
const DPT = HDMAX / BLK; // output dims per thread
// Query heads per workgroup (paged module, define HG, 2-4: the heads of a GQA group, or a divisor
// of it): every key and value is read once for all of them. 1 without the define. A value per
// head (score, probability, running max, normalizer, output element) is one Heads vector, so the
// per-key arithmetic is one vector operation for all the heads, with no per-head loop or array
// (SwiftShader keeps function-scope arrays in memory); with HG 1 it is the scalar f32 code.
#ifdef HG
const HG = {{HG}}u;
#if HG == 2
alias Heads = vec2f;
fn headOf(x: Heads, h: u32) -> f32 { return x[h]; }
#else
alias Heads = vec4f; // HG 3 leaves lane 3 as padding (a zero query), never stored
fn headOf(x: Heads, h: u32) -> f32 { return x[h]; }
#endif
#else
const HG = 1u;
alias Heads = f32;
fn headOf(x: Heads, h: u32) -> f32 { return x; }
#endif

@group(0) @binding(0) var<uniform> p: AttentionParams;
@group(0) @binding(1) var<storage, read_write> out: array<f32>; // (T, NH, HD) f32
@group(0) @binding(2) var<storage, read> q: array<f32>;         // (T, NH, HD) f32
#if defined(KV)
@group(0) @binding(3) var<storage, read> kCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(4) var<storage, read> vCache: array<KvWord>; // (pages, P, NKV, HD) KV
@group(0) @binding(5) var<storage, read> pageTable: array<u32>; // (S, pagesPerSlot) u32
@group(0) @binding(6) var<storage, read> slot: array<u32>;      // (T) u32
@group(0) @binding(7) var<storage, read> pos: array<u32>;       // (T) u32
@group(0) @binding(8) var<storage, read_write> partLse: array<f32>; // split: (T, NH, splits) f32
// attention_combine's inputs (its bindings 1..3; the numbers are free in that entry point)
@group(0) @binding(2) var<storage, read> splitLse: array<f32>; // (T, NH, splits) f32
@group(0) @binding(3) var<storage, read> splitOut: array<f32>; // (T, NH, splits, HD) f32
#ifdef APART
@group(0) @binding(4) var<storage, read> aA: array<f32>;            // (aR, NH HD) f32
@group(0) @binding(5) var<storage, read_write> aParts: array<f32>;  // (NH, T, aR) f32
#endif
#else
@group(0) @binding(3) var<storage, read> kCache: array<f32>;    // training: k (T, NKV, HD) f32
@group(0) @binding(4) var<storage, read> vCache: array<f32>;    // training: v (T, NKV, HD) f32
#endif

var<workgroup> qs: array<Heads, HDMAX>; // scaled query (element d of each head)
var<workgroup> ps: array<Heads, BLK>;   // scores, then probabilities, of the current block
var<workgroup> keyAt: array<u32, BLK>; // element index of each key's head in the current block
var<workgroup> nKeysShared: u32;

#if defined(KV)
var<private> tableRow: u32; // slot * pagesPerSlot of the query's sequence

// Element index of key j's KV head at kvBase (= kvh * HD) in the paged pool.
fn keyIndex(kvBase: u32, j: u32) -> u32 {
  let page = pageTable[tableRow + (j >> p.pageShift)];
  return ((page << p.pageShift) + (j & ((1u << p.pageShift) - 1u))) * p.NKV * p.HD + kvBase;
}

// The HG query rows th .. th + HG - 1 (th = t * NH + h, heads of one token) into qs; returns their
// key count (positions 0..pos[t]). Sets tableRow.
fn loadQuery(th: u32, lid: u32) -> u32 {
  let t = th / p.NH;
  tableRow = slot[t] * p.pagesPerSlot;
  for (var d = lid; d < p.HD; d += BLK) {
#if !defined(HG)
    qs[d] = q[th * p.HD + d] * p.scale;
#elif HG == 2
    qs[d] = vec2f(q[th * p.HD + d], q[(th + 1u) * p.HD + d]) * p.scale;
#else
#if HG == 4
    qs[d] = vec4f(q[th * p.HD + d], q[(th + 1u) * p.HD + d], q[(th + 2u) * p.HD + d], q[(th + 3u) * p.HD + d]) * p.scale;
#else
    qs[d] = vec4f(q[th * p.HD + d], q[(th + 1u) * p.HD + d], q[(th + 2u) * p.HD + d], 0.0) * p.scale;
#endif
#endif
  }
  if (lid == 0u) { nKeysShared = min(pos[t] + 1u, p.maxT); }
  // The key count comes from a buffer; workgroupUniformLoad makes the block loop provably uniform.
  return workgroupUniformLoad(&nKeysShared);
}

fn kvHeadBase(th: u32) -> u32 { return ((th % p.NH) / (p.NH / p.NKV)) * p.HD; }

// One workgroup per (token, HG heads): th = t * NH + h for the first head h.
@compute @workgroup_size(BLK)
fn attention_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                     @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg) * HG;
  if (th >= p.T * p.NH) { return; }
  let nKeys = loadQuery(th, lid);
  attendKeys(th, 1u, kvHeadBase(th), 0u, nKeys, lid);
}

// ---- split-K decode attention (flash-decoding) ------------------------------------------------
// A long context read by one workgroup per (token, head) leaves most of a GPU idle in decode
// (T * NH workgroups). attention_split gives each (token, head) `splits` workgroups, split c
// attending to keys [c * splitKeys, (c + 1) * splitKeys) and writing its normalized output and
// log-sum-exp to the split buffers (out bound to the split outputs, partLse); attention_combine weighs the splits by
// exp(lse_c - max lse). A split past the sequence's end writes lse = -FLT_MAX (weight 0).
// With HG heads per workgroup, workgroup (t * NH / HG + hg) * splits + c takes split c of heads
// th .. th + HG - 1 (th = t * NH + hg * HG), whose partial rows are (th + h) * splits + c.
@compute @workgroup_size(BLK)
fn attention_split(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32) {
  let w = linearGroup(wid, nwg);
  if (w >= p.T * (p.NH / HG) * p.splits) { return; }
  let c = w % p.splits;
  let th = (w / p.splits) * HG;
  let g = th * p.splits + c; // the first head's partial row; head h's is g + h * splits
  let nKeys = loadQuery(th, lid);
  let first = c * p.splitKeys;
  let end = min(first + p.splitKeys, nKeys);
  if (first >= end) {
    for (var h = 0u; h < HG; h++) {
      for (var d = lid; d < p.HD; d += BLK) { out[(g + h * p.splits) * p.HD + d] = 0.0; }
      if (lid == 0u) { partLse[g + h * p.splits] = -3.40282346e38; }
    }
    return;
  }
  let lse = attendKeys(g, p.splits, kvHeadBase(th), first, end, lid);
  if (lid == 0u) {
    for (var h = 0u; h < HG; h++) { partLse[g + h * p.splits] = headOf(lse, h); }
  }
}

#ifdef APART
// The LoRA A product of the projection after attention (o_proj's u = out aA^T, aA (aR, NH HD))
// begun in attention_combine (define APART; src/ops/forward.ts attention's `next`): workgroup
// t NH + h, which writes head h's HD outputs of token t, adds up its share of each row i of u,
// sum_d aA[i, h HD + d] out[t, h HD + d], into aParts at (h, t, i); the GEMV of o_proj adds the NH
// shares up as it takes the B product (shaders/gemv.wgsl UPART): no A product of its own. The
// outputs are summed from workgroup memory (orow), the values stored, so nothing is read back.
var<workgroup> orow: array<f32, HDMAX>; // the head's outputs
var<workgroup> ared: array<f32, BLK>;

// Workgroup th's shares: each row i by P threads (P = BLK / aR, at least 1), their sums added in
// ared. Holds barriers: call it in uniform control flow.
fn aPartials(th: u32, lid: u32) {
  workgroupBarrier(); // orow is whole
  let t = th / p.NH;
  let h = th - t * p.NH;
  let P = max(1u, BLK / p.aR);
  let per = BLK / P; // rows a round
  let q0 = lid / P;
  let sl = lid % P;
  let a0 = h * p.HD;
  let row = p.NH * p.HD;
  for (var base = 0u; base < p.aR; base += per) {
    let i = base + q0;
    let mine = q0 < per && i < p.aR;
    var s = 0.0;
    if (mine) {
      for (var d = sl; d < p.HD; d += P) { s += aA[i * row + a0 + d] * orow[d]; }
    }
    ared[lid] = s;
    workgroupBarrier();
    if (mine && sl == 0u) {
      var tot = 0.0;
      for (var j = 0u; j < P; j++) { tot += ared[lid + j]; }
      aParts[(h * p.T + t) * p.aR + i] = tot;
    }
    workgroupBarrier();
  }
}
#endif

@compute @workgroup_size(BLK)
fn attention_combine(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                     @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg);
  if (th >= p.T * p.NH) { return; } // a whole workgroup (uniform)
  let g0 = th * p.splits;
  var mx = -3.40282346e38;
  for (var c = 0u; c < p.splits; c++) { mx = max(mx, splitLse[g0 + c]); }
  var den = 0.0;
  for (var c = 0u; c < p.splits; c++) { den += exp(splitLse[g0 + c] - mx); }
  for (var d = lid; d < p.HD; d += BLK) {
    var o = 0.0;
    for (var c = 0u; c < p.splits; c++) { o += exp(splitLse[g0 + c] - mx) * splitOut[(g0 + c) * p.HD + d]; }
    out[th * p.HD + d] = o / den;
#ifdef APART
    orow[d] = o / den;
#endif
  }
#ifdef APART
  aPartials(th, lid);
#endif
}

#ifdef LANES
// ---- attention_lanes: split-K decode attention, each key's row read by LK lanes together ------
// attention_split's work and outputs (split c of the HG heads th .. th + HG - 1 of token t: keys
// [c splitKeys, (c + 1) splitKeys) of 0..pos[t]; its normalized output and log-sum-exp per head
// at partial row (th + h) * splits + c, which with one split is the final row th + h), laid out
// for a GPU's memory system. attention_split gives each of its 64 threads a key and walks the
// key's row 4 bytes at a time, so neighbouring threads read 2 KB apart (NKV * HD f16 elements)
// and a workgroup re-reads its block's scores from workgroup memory between three barriers per 64
// keys; the H100 of 2026-12-06 ran it at 42 GB/s (1.6% of its copy bandwidth) at context 2,048.
// Here the 256 threads are NG = 256 / LK groups of LK consecutive lanes. Group g takes keys
// first + g, first + g + NG, ... (two a step, their K and V loads issued before any is used) and
// lane l of the group reads 16-byte pieces l, l + LK, ... (VPT of them) of the key's K and V rows:
// at Qwen3-4B's HD 128 in f16 a row is 16 pieces, one coalesced 256-byte read at LK 16. The lanes'
// q . k partial sums meet through a subgroupShuffleXor butterfly (LK is at most the adapter's
// smallest subgroup: a group's lanes are one aligned run of a subgroup, as in
// common/gemvlanes.wgsl). Each group keeps its own running max, normalizer and output pieces in
// registers (online softmax: no barrier in the key loop); the NG groups' states are merged once
// at the end, through workgroup memory. The query pieces stay in registers too (VPT * EPV
// elements a lane, times HG heads). src/ops/forward.ts attentionLanes picks LK and VPT.
const LK = {{LK}}u;    // lanes a key (a power of two, at most the smallest subgroup)
const VPT = {{VPT}}u;  // 16-byte pieces a lane: HD = LK * VPT * EPV
const NG = 256u / LK;  // key groups a workgroup
#if KV == f16
const EPV = 8u;        // elements a 16-byte piece
alias Piece = vec4u;
#else
const EPV = 4u;
alias Piece = vec4f;
#endif
const QN = VPT * EPV;  // query / output elements a lane
@group(0) @binding(3) var<storage, read> kPieces: array<Piece>; // the K pool, 16 bytes an element
@group(0) @binding(4) var<storage, read> vPieces: array<Piece>; // the V pool
var<private> laneQ: array<Heads, QN>;   // scaled query elements (lane + LK i) EPV + e of each head
var<private> laneAcc: array<Heads, QN>; // the group's output elements, unnormalized
var<workgroup> groupM: array<Heads, NG>;
var<workgroup> groupL: array<Heads, NG>;
var<workgroup> mergeRed: array<Heads, 256>;
var<workgroup> laneKeys: u32;

// Element d of the HG query rows th .. th + HG - 1 (HG 3: a zero fourth lane).
fn queryHeads(th: u32, d: u32) -> Heads {
#if !defined(HG)
  return q[th * p.HD + d];
#elif HG == 2
  return vec2f(q[th * p.HD + d], q[(th + 1u) * p.HD + d]);
#elif HG == 4
  return vec4f(q[th * p.HD + d], q[(th + 1u) * p.HD + d], q[(th + 2u) * p.HD + d], q[(th + 3u) * p.HD + d]);
#else
  return vec4f(q[th * p.HD + d], q[(th + 1u) * p.HD + d], q[(th + 2u) * p.HD + d], 0.0);
#endif
}

// The partial q . k of a piece (query elements e0 .. e0 + EPV - 1).
fn pieceDot(w: Piece, e0: u32) -> Heads {
#if KV == f16
  let a = unpack2x16float(w.x);
  let b = unpack2x16float(w.y);
  let c = unpack2x16float(w.z);
  let d = unpack2x16float(w.w);
  return laneQ[e0] * a.x + laneQ[e0 + 1u] * a.y + laneQ[e0 + 2u] * b.x + laneQ[e0 + 3u] * b.y +
         laneQ[e0 + 4u] * c.x + laneQ[e0 + 5u] * c.y + laneQ[e0 + 6u] * d.x + laneQ[e0 + 7u] * d.y;
#else
  return laneQ[e0] * w.x + laneQ[e0 + 1u] * w.y + laneQ[e0 + 2u] * w.z + laneQ[e0 + 3u] * w.w;
#endif
}

// laneAcc[e0 ..] += pr * the value piece.
fn pieceAdd(w: Piece, e0: u32, pr: Heads) {
#if KV == f16
  let a = unpack2x16float(w.x);
  let b = unpack2x16float(w.y);
  let c = unpack2x16float(w.z);
  let d = unpack2x16float(w.w);
  laneAcc[e0] += pr * a.x;
  laneAcc[e0 + 1u] += pr * a.y;
  laneAcc[e0 + 2u] += pr * b.x;
  laneAcc[e0 + 3u] += pr * b.y;
  laneAcc[e0 + 4u] += pr * c.x;
  laneAcc[e0 + 5u] += pr * c.y;
  laneAcc[e0 + 6u] += pr * d.x;
  laneAcc[e0 + 7u] += pr * d.y;
#else
  laneAcc[e0] += pr * w.x;
  laneAcc[e0 + 1u] += pr * w.y;
  laneAcc[e0 + 2u] += pr * w.z;
  laneAcc[e0 + 3u] += pr * w.w;
#endif
}

// Workgroup (t * NH / HG + hg) * splits + c: split c of heads th .. th + HG - 1 (th = t * NH + hg * HG).
@compute @workgroup_size(256)
fn attention_lanes(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                   @builtin(local_invocation_index) lid: u32) {
  let w = linearGroup(wid, nwg);
  if (w >= p.T * (p.NH / HG) * p.splits) { return; } // a whole workgroup (uniform)
  let c = w % p.splits;
  let th = (w / p.splits) * HG;
  let t = th / p.NH;
  let g = lid / LK;
  let lane = lid % LK;
  tableRow = slot[t] * p.pagesPerSlot;
  if (lid == 0u) { laneKeys = min(pos[t] + 1u, p.maxT); }
  let nKeys = workgroupUniformLoad(&laneKeys); // the key loop below is then provably uniform
  let first = c * p.splitKeys;
  let end = min(first + p.splitKeys, nKeys);
  if (first >= end) {
    // A split past the sequence's end: weight 0 in attention_combine.
    for (var h = 0u; h < HG; h++) {
      let r = (th + h) * p.splits + c;
      for (var d = lid; d < p.HD; d += 256u) { out[r * p.HD + d] = 0.0; }
      if (lid == 0u) { partLse[r] = -3.40282346e38; }
    }
    return;
  }
  for (var i = 0u; i < VPT; i++) {
    for (var e = 0u; e < EPV; e++) {
      laneQ[i * EPV + e] = queryHeads(th, (lane + LK * i) * EPV + e) * p.scale;
      laneAcc[i * EPV + e] = Heads(0.0);
    }
  }
  let kvBase = kvHeadBase(th);
  var m = Heads(-3.40282346e38);
  var l = Heads(0.0);
  // Two keys a step per group, ja and jb = ja + NG; past `end` they read key end - 1 again
  // (mapped, cached) and weigh 0. Every thread runs the same steps (the shuffles need its group).
  for (var s = first; s < end; s += 2u * NG) {
    let ja = s + g;
    let jb = ja + NG;
    let ia = keyIndex(kvBase, min(ja, end - 1u)) / EPV + lane;
    let ib = keyIndex(kvBase, min(jb, end - 1u)) / EPV + lane;
    var ka: array<Piece, VPT>;
    var kb: array<Piece, VPT>;
    var va: array<Piece, VPT>;
    var vb: array<Piece, VPT>;
    for (var i = 0u; i < VPT; i++) {
      ka[i] = kPieces[ia + LK * i];
      kb[i] = kPieces[ib + LK * i];
      va[i] = vPieces[ia + LK * i];
      vb[i] = vPieces[ib + LK * i];
    }
    var sa = Heads(0.0);
    var sb = Heads(0.0);
    for (var i = 0u; i < VPT; i++) {
      sa += pieceDot(ka[i], i * EPV);
      sb += pieceDot(kb[i], i * EPV);
    }
    for (var x = LK / 2u; x > 0u; x >>= 1u) {
      sa += subgroupShuffleXor(sa, x);
      sb += subgroupShuffleXor(sb, x);
    }
    let mNew = max(m, max(select(Heads(-3.40282346e38), sa, ja < end), select(Heads(-3.40282346e38), sb, jb < end)));
    let corr = exp(m - mNew);
    let pa = select(Heads(0.0), exp(sa - mNew), ja < end);
    let pb = select(Heads(0.0), exp(sb - mNew), jb < end);
    l = l * corr + pa + pb;
    for (var e = 0u; e < QN; e++) { laneAcc[e] *= corr; }
    for (var i = 0u; i < VPT; i++) {
      pieceAdd(va[i], i * EPV, pa);
      pieceAdd(vb[i], i * EPV, pb);
    }
    m = mNew;
  }
  // Merge the groups: weights exp(m_g - M) (0 for a group that saw no key), normalizer L.
  if (lane == 0u) { groupM[g] = m; }
  workgroupBarrier();
  var mx = Heads(-3.40282346e38);
  for (var x = 0u; x < NG; x++) { mx = max(mx, groupM[x]); }
  let wg = exp(m - mx);
  if (lane == 0u) { groupL[g] = l * wg; }
  workgroupBarrier();
  var den = Heads(0.0);
  for (var x = 0u; x < NG; x++) { den += groupL[x]; }
  // Output element e of each lane: group 0 sums the NG groups' pieces, in group order.
  for (var e = 0u; e < QN; e++) {
    mergeRed[lid] = laneAcc[e] * wg;
    workgroupBarrier();
    if (g == 0u) {
      var o = Heads(0.0);
      for (var x = 0u; x < NG; x++) { o += mergeRed[x * LK + lane]; }
      o = o / den;
      let d = (lane + LK * (e / EPV)) * EPV + e % EPV;
      for (var h = 0u; h < HG; h++) { out[((th + h) * p.splits + c) * p.HD + d] = headOf(o, h); }
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    let lse = mx + log(den);
    for (var h = 0u; h < HG; h++) { partLse[(th + h) * p.splits + c] = headOf(lse, h); }
  }
}
#endif
#else
// Element index of key j's KV head at kvBase (= kvh * HD) in k/v (T, NKV, HD).
fn keyIndex(kvBase: u32, j: u32) -> u32 { return kvBase + j * p.NKV * p.HD; }
#endif

// q . k for the HG scaled queries in qs and the key whose head starts at element kb (even in
// f16): the key is read once for all of them. Each thread walks its own key, so its loads are
// issued 4 words at a time before any is used (a loop of one load and its products leaves one in
// flight: the H100 of 2026-12-06 ran this split decode attention at 160 GB/s); the products are
// summed in the same order as one at a time.
fn keyDot(kb: u32) -> Heads {
  var dot = Heads(0.0);
  var d = 0u;
#if defined(KV) && KV == f16
  let w = kb >> 1u; // kb is even: element kb + d is half (d & 1) of word w + d / 2
  let d8 = p.HD & ~7u;
  while (d < d8) {
    let i = w + (d >> 1u);
    let k0 = unpack2x16float(kCache[i]);
    let k1 = unpack2x16float(kCache[i + 1u]);
    let k2 = unpack2x16float(kCache[i + 2u]);
    let k3 = unpack2x16float(kCache[i + 3u]);
    dot += qs[d] * k0.x;
    dot += qs[d + 1u] * k0.y;
    dot += qs[d + 2u] * k1.x;
    dot += qs[d + 3u] * k1.y;
    dot += qs[d + 4u] * k2.x;
    dot += qs[d + 5u] * k2.y;
    dot += qs[d + 6u] * k3.x;
    dot += qs[d + 7u] * k3.y;
    d += 8u;
  }
  while (d < p.HD) {
    let kk = unpack2x16float(kCache[w + (d >> 1u)]);
    dot += qs[d] * kk.x;
    dot += qs[d + 1u] * kk.y;
    d += 2u;
  }
#else
  let d4 = p.HD & ~3u;
  while (d < d4) {
    let k0 = kCache[kb + d];
    let k1 = kCache[kb + d + 1u];
    let k2 = kCache[kb + d + 2u];
    let k3 = kCache[kb + d + 3u];
    dot += qs[d] * k0;
    dot += qs[d + 1u] * k1;
    dot += qs[d + 2u] * k2;
    dot += qs[d + 3u] * k3;
    d += 4u;
  }
  while (d < p.HD) {
    dot += qs[d] * kCache[kb + d];
    d += 1u;
  }
#endif
  return dot;
}

// Value element i of the cache (or of v on the training path), as f32.
fn valueAt(i: u32) -> f32 {
#if defined(KV) && KV == f16
  return f16Pick(vCache[i >> 1u], i);
#else
  return vCache[i];
#endif
}

// The HG query rows (scaled, already in qs) against keys/values first <= j < end of KV head kvBase
// (keyIndex): writes out[row + h * rowStride] for head h and returns the heads' log-sum-exps of
// the scaled scores. Each key and value element is read once for the HG heads.
fn attendKeys(row: u32, rowStride: u32, kvBase: u32, first: u32, end: u32, lid: u32) -> Heads {
  var m = Heads(-3.40282346e38);
  var l = Heads(0.0);
  var acc: array<Heads, DPT>;
  for (var b0 = first; b0 < end; b0 += BLK) {
    let j = b0 + lid;
    var s = Heads(-3.40282346e38);
    if (j < end) {
      let kb = keyIndex(kvBase, j);
      keyAt[lid] = kb;
      s = keyDot(kb);
    }
    ps[lid] = s;
    workgroupBarrier();
    var mNew = m;
    for (var i = 0u; i < BLK; i++) { mNew = max(mNew, ps[i]); }
    workgroupBarrier(); // everyone has read the scores before they become probabilities
    ps[lid] = select(Heads(0.0), exp(s - mNew), j < end);
    workgroupBarrier();
    let corr = exp(m - mNew);
    let nb = min(BLK, end - b0);
    var lb = Heads(0.0);
    for (var i = 0u; i < nb; i++) { lb += ps[i]; }
    l = l * corr + lb;
    for (var e = 0u; e < DPT; e++) {
      let d = lid + e * BLK;
      if (d < p.HD) {
        var a = acc[e] * corr;
        // 4 keys' values loaded before any is used, summed in key order (as keyDot's loads)
        var i = 0u;
        let n4 = nb & ~3u;
        while (i < n4) {
          let v0 = valueAt(keyAt[i] + d);
          let v1 = valueAt(keyAt[i + 1u] + d);
          let v2 = valueAt(keyAt[i + 2u] + d);
          let v3 = valueAt(keyAt[i + 3u] + d);
          a += ps[i] * v0;
          a += ps[i + 1u] * v1;
          a += ps[i + 2u] * v2;
          a += ps[i + 3u] * v3;
          i += 4u;
        }
        while (i < nb) {
          a += ps[i] * valueAt(keyAt[i] + d);
          i += 1u;
        }
        acc[e] = a;
      }
    }
    m = mNew;
    workgroupBarrier(); // the block's probabilities are consumed before the next block overwrites them
  }
  for (var e = 0u; e < DPT; e++) {
    let d = lid + e * BLK;
    if (d < p.HD) {
      let o = acc[e] / l;
      for (var h = 0u; h < HG; h++) { out[(row + h * rowStride) * p.HD + d] = headOf(o, h); }
    }
  }
  return m + log(l);
}

#if !defined(KV)
// ---- training path (module without KV): one causal sequence at positions 0..T-1, no cache ----
// k and v (T, NKV, HD) f32 are bound as kCache / vCache, so the kernels below share q, the params
// and attendKeys with attention_forward.

@group(0) @binding(5) var<storage, read_write> lse: array<f32>; // (T, NH) f32
#ifdef TREE
@group(0) @binding(6) var<storage, read> keyEndLse: array<u32>; // (T) u32: the forward's keyEnd
@group(0) @binding(9) var<storage, read> keyEnd: array<u32>;    // (T) u32: the backward's
#endif

// As attention_forward, also saving lse = log sum_j exp(scale q.k_j) for the backward.
@compute @workgroup_size(BLK)
fn attention_forward_lse(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                         @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg); // t * NH + h
  if (th >= p.T * p.NH) { return; }
  let t = th / p.NH;
  let kvh = (th - t * p.NH) / (p.NH / p.NKV);
  for (var d = lid; d < p.HD; d += BLK) { qs[d] = q[th * p.HD + d] * p.scale; }
  workgroupBarrier();
  let m = attendKeys(th, 1u, kvh * p.HD, 0u, t + 1u, lid);
  if (lid == 0u) { lse[th] = m; }
}

// Backward (FlashAttention-2 recurrences, probabilities recomputed from lse, no T x T buffer):
//   P_ij = exp(scale q_i.k_j - lse_i), dP_ij = dout_i.v_j, D_i = dout_i.out_i,
//   dS_ij = P_ij (dP_ij - D_i),
//   dq_i += scale sum_j dS_ij k_j,  dk_j += scale sum_i dS_ij q_i,  dv_j += sum_i P_ij dout_i
// (i over queries >= j and over the query heads sharing j's KV head). Two kernels, no atomics:
// attention_backward_dq (one workgroup per query row; also writes D) then
// attention_backward_dkv (one workgroup per key row and KV head; reads D).

@group(0) @binding(1) var<storage, read_write> dq: array<f32>;    // (T, NH, HD) f32
@group(0) @binding(1) var<storage, read_write> dk: array<f32>;    // (T, NKV, HD) f32
@group(0) @binding(5) var<storage, read> dout: array<f32>;        // (T, NH, HD) f32
@group(0) @binding(6) var<storage, read> lseIn: array<f32>;       // (T, NH) f32
@group(0) @binding(7) var<storage, read_write> rowDot: array<f32>; // (T, NH) f32: D, written by _dq
@group(0) @binding(7) var<storage, read> rowDotIn: array<f32>;    // (T, NH) f32: D, read by _dkv
@group(0) @binding(8) var<storage, read> outSaved: array<f32>;    // (T, NH, HD) f32
@group(0) @binding(8) var<storage, read_write> dv: array<f32>;    // (T, NKV, HD) f32

var<workgroup> os: array<f32, HDMAX>; // dout_i (dq) or v_j (dkv)
var<workgroup> dss: array<f32, BLK>;  // dS of the current block
var<workgroup> rows: array<u32, BLK>; // query row (t * NH + h) of each pair in the block (dkv)

@compute @workgroup_size(BLK)
fn attention_backward_dq(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                         @builtin(local_invocation_index) lid: u32) {
  let th = linearGroup(wid, nwg); // i * NH + h
  if (th >= p.T * p.NH) { return; }
  let i = th / p.NH;
  let kvBase = ((th - i * p.NH) / (p.NH / p.NKV)) * p.HD;
  let rowStride = p.NKV * p.HD;
  for (var d = lid; d < p.HD; d += BLK) {
    qs[d] = q[th * p.HD + d] * p.scale;
    os[d] = dout[th * p.HD + d];
  }
  workgroupBarrier();
  var di = 0.0; // every thread sums the same row: HD reads, no extra barrier
  for (var d = 0u; d < p.HD; d++) { di += os[d] * outSaved[th * p.HD + d]; }
  if (lid == 0u) { rowDot[th] = di; }
  let lseI = lseIn[th];
  let nKeys = i + 1u;
  var acc: array<f32, DPT>;
  for (var b0 = 0u; b0 < nKeys; b0 += BLK) {
    let j = b0 + lid;
    var ds = 0.0;
    if (j < nKeys) {
      let kb = kvBase + j * rowStride;
      var s = 0.0;
      var dp = 0.0;
      for (var d = 0u; d < p.HD; d++) {
        s += qs[d] * kCache[kb + d];
        dp += os[d] * vCache[kb + d];
      }
      ds = exp(s - lseI) * (dp - di);
    }
    dss[lid] = ds;
    workgroupBarrier();
    let nb = min(BLK, nKeys - b0);
    for (var e = 0u; e < DPT; e++) {
      let d = lid + e * BLK;
      if (d < p.HD) {
        var a = acc[e];
        for (var u = 0u; u < nb; u++) { a += dss[u] * kCache[kvBase + (b0 + u) * rowStride + d]; }
        acc[e] = a;
      }
    }
    workgroupBarrier(); // the block's dS is consumed before the next block overwrites it
  }
  for (var e = 0u; e < DPT; e++) {
    let d = lid + e * BLK;
    if (d < p.HD) { dq[th * p.HD + d] = dq[th * p.HD + d] + p.scale * acc[e]; }
  }
}

@compute @workgroup_size(BLK)
fn attention_backward_dkv(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u,
                          @builtin(local_invocation_index) lid: u32) {
  let jk = linearGroup(wid, nwg); // j * NKV + kvh
  if (jk >= p.T * p.NKV) { return; }
  let j = jk / p.NKV;
  let kvh = jk - j * p.NKV;
  let G = p.NH / p.NKV; // query heads per KV head
  for (var d = lid; d < p.HD; d += BLK) {
    qs[d] = kCache[jk * p.HD + d] * p.scale; // scaled k_j
    os[d] = vCache[jk * p.HD + d];
  }
  workgroupBarrier();
  // Pairs (query i >= j, head h of the group), e = (i - j) * G + (h - kvh * G).
  let nPairs = (p.T - j) * G;
  var accK: array<f32, DPT>;
  var accV: array<f32, DPT>;
  for (var b0 = 0u; b0 < nPairs; b0 += BLK) {
    let e = b0 + lid;
    var pij = 0.0;
    var ds = 0.0;
    var th = 0u;
    if (e < nPairs) {
      th = (j + e / G) * p.NH + kvh * G + e % G;
      let qb = th * p.HD;
      var s = 0.0;
      var dp = 0.0;
      for (var d = 0u; d < p.HD; d++) {
        s += q[qb + d] * qs[d];
        dp += dout[qb + d] * os[d];
      }
      pij = exp(s - lseIn[th]);
      ds = pij * (dp - rowDotIn[th]);
    }
    ps[lid] = pij;
    dss[lid] = ds;
    rows[lid] = th;
    workgroupBarrier();
    let nb = min(BLK, nPairs - b0);
    for (var c = 0u; c < DPT; c++) {
      let d = lid + c * BLK;
      if (d < p.HD) {
        var ak = accK[c];
        var av = accV[c];
        for (var u = 0u; u < nb; u++) {
          let qb = rows[u] * p.HD + d;
          ak += dss[u] * q[qb];
          av += ps[u] * dout[qb];
        }
        accK[c] = ak;
        accV[c] = av;
      }
    }
    workgroupBarrier(); // the block is consumed before the next one overwrites it
  }
  for (var c = 0u; c < DPT; c++) {
    let d = lid + c * BLK;
    if (d < p.HD) {
      let o = jk * p.HD + d;
      dk[o] = dk[o] + p.scale * accK[c];
      dv[o] = dv[o] + accV[c];
    }
  }
}
#endif
#endif // TILED
