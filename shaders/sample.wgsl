#ifdef SUBGROUPS
enable subgroups;
#endif
// Token sampling over rows of logits (B, V); the ids and their log-probs leave the GPU. The entries
// here (sample_forward, sample_rows) take one workgroup per row; greedy and untruncated draws go
// through sample_chunks + sample_pick at the end of the file instead (many workgroups a row).
//   temperature <= 0: argmax, lowest index on ties.
//   otherwise: softmax(logits / temperature) restricted to the top-k tokens (topK 0 = off), then
//   to the smallest nucleus with mass >= topP (topP >= 1 = off), renormalized, one draw.
// Both cut-offs are thresholds on the 32-bit order-preserving key of the f32 value z:
//   top-k: the k-th largest key, by a radix select: 4 passes over the row, each counting the keys
//     that share the digits found so far into a 256-bin histogram of the next 8 bits.
//   top-p: the largest key whose kept mass, sum_{key >= u} exp(z - mx), is still >= topP times
//     the top-k set's mass, by 32 rounds of bisection. The rounds run over candidates gathered into
//     workgroup memory (the top-k set when it has at most CAP tokens, else the CAP largest by a
//     second radix select) whenever the candidates hold at least that much mass, so the threshold
//     lies among them; otherwise (a flat distribution without top-k) over the whole row.
//   (Measured on an NVIDIA H200 before the radix select and the candidates: 64 bisection passes
//   over Qwen3's 151,936 logits took 7.8 ms, 57% of a 4-layer decode step's GPU time;
//   bench/results/2026-12-04-h200/round.log.)
// Tokens tied with the threshold are all kept (HF's sort would keep an arbitrary subset).
// Thread j owns tokens j, j+WG, j+2WG, ...; the draw walks threads' masses in order, then the
// chosen thread's tokens: a fixed order over the kept set, so the draw is exact and reproducible.
// RNG: counter-based hash of (seed, step, row), so the same inputs give the same ids.
// ROW_RNG (sample_rows): each row brings its own (seed, step, hash row) from rowRng, so one
// dispatch over a batch draws exactly what one-row dispatches with those uniforms draw (a row's
// workgroup reads only its own logits), and the log-probs go to outIds[B + row] as f32 bits:
// ids and log-probs in one buffer, one readback, and the ids feed the next step's embedding.
// outLogp: the log-prob of the drawn id under the distribution it was drawn from (temperature,
// then top-k, then top-p, renormalized): (z - mx) - log(kept mass), the PPO behaviour log-prob.
// Greedy writes 0 (a point mass).
//
// The workgroup reductions are common/reduce.wgsl's: subgroup ops when the device has them
// (define SUBGROUPS), else a shared-memory tree.

struct SampleParams {
  B: u32,
  V: u32,
  topK: u32,
  seed: u32,
  step: u32,
  temperature: f32,
  topP: f32,
}

override WG: u32 = 256;

@group(0) @binding(0) var<uniform> p: SampleParams;
@group(0) @binding(2) var<storage, read> logits: array<f32>;       // (B, V) f32
#ifdef ROW_RNG
@group(0) @binding(1) var<storage, read_write> outIds: array<u32>; // (2B) u32: ids, then log-prob f32 bits
@group(0) @binding(3) var<storage, read> rowRng: array<u32>;        // (B, 3) u32: seed, step, hash row
#else
@group(0) @binding(1) var<storage, read_write> outIds: array<u32>; // (B) u32
@group(0) @binding(3) var<storage, read_write> outLogp: array<f32>; // (B) f32
#endif

#include "common/grid.wgsl"


const LOWEST = -3.40282346e38; // -FLT_MAX (an -inf literal is rejected by const evaluation)
const NONE = 0xffffffffu;      // no token

// Monotone map f32 -> u32: a < b  <=>  key(a) < key(b) (for non-NaN values).
fn orderedKey(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn pcg(v: u32) -> u32 {
  let s = v * 747796405u + 2891336453u;
  let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
  return (w >> 22u) ^ w;
}

// Uniform in [0, 1) with 24 random bits.
fn uniform01(seed: u32, step: u32, row: u32) -> f32 {
  let h = pcg(pcg(pcg(seed) + step) + row);
  return f32(h >> 8u) * (1.0 / 16777216.0);
}

// The draw of a row: hash(seed, step, row) from the params, or the row's own triple (ROW_RNG).
fn rowUniform(row: u32) -> f32 {
#ifdef ROW_RNG
  return uniform01(rowRng[3u * row], rowRng[3u * row + 1u], rowRng[3u * row + 2u]);
#else
  return uniform01(p.seed, p.step, row);
#endif
}

fn writePick(row: u32, id: u32, logp: f32) {
  outIds[row] = id;
#ifdef ROW_RNG
  outIds[p.B + row] = bitcast<u32>(logp);
#else
  outLogp[row] = logp;
#endif
}

var<workgroup> redF: array<f32, WG>;
var<workgroup> redU: array<u32, WG>;
var<workgroup> masses: array<f32, WG>; // the threads' (or sample_pick's chunks') masses, for walkMasses

// Thread 0's walk: the first j < n with masses[j] > 0 whose mass takes the running sum (from
// `start`) past r, and the sum before it; where rounding leaves r past the end, the last with mass.
struct Walked {
  at: u32,
  before: f32,
}
fn walkMasses(n: u32, start: f32, r: f32) -> Walked {
  var before = start;
  var last = 0u;
  var beforeLast = start;
  for (var j = 0u; j < n; j++) {
    let m = masses[j];
    if (m > 0.0) {
      last = j;
      beforeLast = before;
      if (before + m > r) { return Walked(j, before); }
    }
    before += m;
  }
  return Walked(last, beforeLast);
}
const CAP = 2048u;                             // top-p candidates held in workgroup memory
var<workgroup> hist: array<atomic<u32>, 256>;  // radix select: counts of the next 8 bits
var<workgroup> pick: vec2u;                    // radix select: (digit, rank left), from thread 0
var<workgroup> cand: array<f32, CAP>;          // top-p candidates' z (in no particular order)
var<workgroup> nCand: atomic<u32>;
var<workgroup> flag: u32;                      // thread 0's decision, read back uniformly
#include "common/reduce.wgsl" (NAME=sumF, T=f32, OP=Add, IDENTITY=0.0, SCRATCH=redF)
#include "common/reduce.wgsl" (NAME=maxF, T=f32, OP=Max, IDENTITY=LOWEST, SCRATCH=redF)
#include "common/reduce.wgsl" (NAME=sumU, T=u32, OP=Add, IDENTITY=0u, SCRATCH=redU)
#include "common/reduce.wgsl" (NAME=maxU, T=u32, OP=Max, IDENTITY=0u, SCRATCH=redU)
#include "common/reduce.wgsl" (NAME=minU, T=u32, OP=Min, IDENTITY=NONE, SCRATCH=redU)

// Index of the largest v, lowest index on ties; i = NONE marks a thread without tokens. Two
// exact u32 reductions: the largest order-preserving key (-0 taken as +0 so they tie as in the
// float comparison; a thread without tokens has key 0, below every real value including -inf),
// then the lowest index among the threads holding it.
fn argmaxIndex(v: f32, i: u32, l: Lanes) -> u32 {
  let key = select(0u, orderedKey(select(v, 0.0, v == 0.0)), i != NONE);
  let best = maxU(key, l);
  return minU(select(NONE, i, key == best), l);
}

#ifdef ROW_RNG
@compute @workgroup_size(WG)
fn sample_rows(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  sampleRow(linearGroup(wid, nwg), l);
}
#else
@compute @workgroup_size(WG)
fn sample_forward(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  sampleRow(linearGroup(wid, nwg), l);
}
#endif

// The k-th largest key of z = logits / temperature over the row (1 <= k <= V), by a radix
// select: round j counts, among the keys whose top 8 j bits are the digits found so far, the next
// 8 bits into hist; thread 0 walks the bins from the top to the one holding the k-th. The result
// is the largest u with count(key >= u) >= k, as a bisection over u would find.
fn kthLargestKey(base: u32, k: u32, lid: u32) -> u32 {
  var prefix = 0u;
  var rank = k;
  for (var round = 0u; round < 4u; round++) {
    let shift = 24u - 8u * round;
    let mask = ~(0xffffffffu >> (8u * round)); // the digits already fixed
    for (var j = lid; j < 256u; j += WG) { atomicStore(&hist[j], 0u); }
    workgroupBarrier();
    for (var i = lid; i < p.V; i += WG) {
      let key = orderedKey(logits[base + i] / p.temperature);
      if ((key & mask) == prefix) { atomicAdd(&hist[(key >> shift) & 255u], 1u); }
    }
    workgroupBarrier();
    if (lid == 0u) {
      var above = 0u;
      var d = 255u;
      loop {
        let c = atomicLoad(&hist[d]);
        if (above + c >= rank || d == 0u) { break; }
        above += c;
        d -= 1u;
      }
      pick = vec2u(d, rank - above);
    }
    let got = workgroupUniformLoad(&pick);
    prefix |= got.x << shift;
    rank = got.y;
  }
  return prefix;
}

// One row per workgroup.
fn sampleRow(row: u32, l: Lanes) {
  let lid = l.lid;
  if (row >= p.B) { return; }
  let base = row * p.V;

  if (p.temperature <= 0.0) {
    // Greedy. Each thread scans its tokens in increasing order, so strict > keeps the lowest index.
    var bestV = LOWEST;
    var bestI = 0xffffffffu;
    for (var i = lid; i < p.V; i += WG) {
      let v = logits[base + i];
      if (bestI == 0xffffffffu || v > bestV) { bestV = v; bestI = i; }
    }
    let best = argmaxIndex(bestV, bestI, l);
    if (lid == 0u) { writePick(row, best, 0.0); }
    return;
  }

  // 1. Row max of z = logits / temperature, for a stable exp.
  var mx = LOWEST;
  for (var i = lid; i < p.V; i += WG) { mx = max(mx, logits[base + i] / p.temperature); }
  mx = maxF(mx, l);

  // 2. Top-k: the k-th largest key (the largest u with count(key(z) >= u) >= topK).
  let topKOn = p.topK > 0u && p.topK < p.V;
  var kLo = 0u;
  if (topKOn) { kLo = kthLargestKey(base, p.topK, lid); }

  // 3. Top-p on the top-k-renormalized distribution: the largest key u >= kLo whose mass
  //    sum_{key >= u} exp(z - mx) is still >= topP * (mass of the top-k set).
  var thr = kLo;
  if (p.topP < 1.0) {
    var total = 0.0;
    for (var i = lid; i < p.V; i += WG) {
      let z = logits[base + i] / p.temperature;
      if (orderedKey(z) >= kLo) { total += exp(z - mx); }
    }
    let want = p.topP * sumF(total, l);
    // Candidates: keys >= cLo, the top-k set when it is small, else the CAP largest (ties add more).
    var cLo = kLo;
    if (!topKOn || p.topK > CAP) { cLo = max(kLo, kthLargestKey(base, min(CAP, p.V), lid)); }
    if (lid == 0u) { atomicStore(&nCand, 0u); }
    workgroupBarrier();
    var own0 = 0.0;
    for (var i = lid; i < p.V; i += WG) {
      let z = logits[base + i] / p.temperature;
      if (orderedKey(z) >= cLo) {
        own0 += exp(z - mx);
        let slot = atomicAdd(&nCand, 1u);
        if (slot < CAP) { cand[slot] = z; }
      }
    }
    let mass0 = sumF(own0, l); // its barrier also orders the candidates' stores before their reads
    if (lid == 0u) { flag = select(0u, 1u, atomicLoad(&nCand) <= CAP && mass0 >= want); }
    let inCandidates = workgroupUniformLoad(&flag) != 0u;
    var lo = kLo;
    var hi = orderedKey(mx);
    if (inCandidates) {
      // mass(key >= cLo) >= want: the threshold is a candidate's key, and every mass the
      // bisection asks for (keys >= mid >= cLo) is a sum over candidates alone.
      lo = cLo;
      let nc = atomicLoad(&nCand); // <= CAP here; the loop below holds no barrier
      for (var it = 0u; it < 32u; it++) {
        let d = hi - lo;
        let mid = lo + (d >> 1u) + (d & 1u); // ceil midpoint without overflow
        var s = 0.0;
        for (var j = lid; j < nc; j += WG) {
          let z = cand[j];
          if (orderedKey(z) >= mid) { s += exp(z - mx); }
        }
        if (sumF(s, l) >= want) { lo = mid; } else { hi = mid - 1u; }
      }
    } else {
      for (var it = 0u; it < 32u; it++) {
        let d = hi - lo;
        let mid = lo + (d >> 1u) + (d & 1u);
        var s = 0.0;
        for (var i = lid; i < p.V; i += WG) {
          let z = logits[base + i] / p.temperature;
          if (orderedKey(z) >= mid) { s += exp(z - mx); }
        }
        if (sumF(s, l) >= want) { lo = mid; } else { hi = mid - 1u; }
      }
    }
    thr = lo;
  }

  // 4. Draw: each thread's kept mass, then thread 0 walks threads and the chosen thread's tokens.
  var own = 0.0;
  for (var i = lid; i < p.V; i += WG) {
    let z = logits[base + i] / p.temperature;
    if (orderedKey(z) >= thr) { own += exp(z - mx); }
  }
  masses[lid] = own;
  workgroupBarrier();
  if (lid == 0u) {
    var total = 0.0;
    for (var j = 0u; j < WG; j++) { total += masses[j]; }
    let r = rowUniform(row) * total;
    let walked = walkMasses(WG, 0.0, r);
    let chosen = walked.at;
    var cum = walked.before;
    var pick = 0xffffffffu;
    var lastKept = 0u;
    for (var i = chosen; i < p.V; i += WG) {
      let z = logits[base + i] / p.temperature;
      if (orderedKey(z) >= thr) {
        lastKept = i;
        cum += exp(z - mx);
        if (cum > r) { pick = i; break; }
      }
    }
    let id = select(pick, lastKept, pick == 0xffffffffu);
    writePick(row, id, (logits[base + id] / p.temperature - mx) - log(total));
  }
}

// ---- chunked draw: untruncated sampling and greedy over many workgroups ----------------------
// sampleRow walks a row of V logits with one workgroup: at Qwen3's 151,936 a max pass, a mass pass
// and thread 0's walk over a thread's ~600 tokens, all on one compute unit of a GPU, every decode
// step (and more passes for top-k / top-p). Without top-k and top-p (a SpyRL round's sampling,
// which training requires) and for greedy, the row splits into chunks of CH tokens instead:
//   sample_chunks: a workgroup a (row, chunk): the chunk's max mc of z = logits / temperature and
//     its mass sc = sum exp(z - mc) (greedy: its largest logit and that logit's lowest index), to
//     chunkOut (B, chunks) as bits.
//   sample_pick: a workgroup a row: the row's max mx = max mc, each chunk's mass sc exp(mc - mx),
//     their total; thread 0 draws r = u * total and walks the chunks' masses in order to the chunk
//     holding r; that chunk's CH tokens, CH / WG consecutive ones a thread, give each thread's mass;
//     thread 0 walks those, then the chosen thread's tokens. Greedy: the largest chunk maximum, the
//     lowest index on ties (argmaxIndex, as sampleRow). The log-prob is (z - mx) - log(total), as
//     sampleRow's.
// A fixed order over the tokens (chunks, then threads, then tokens), so the draw is exact and
// reproducible, with the same RNG and outputs as sampleRow (ROW_RNG included); the order differs
// from sampleRow's, so the same uniform can pick a different token: the same distribution.
// src/ops/forward.ts sample / sampleRows pick it where V <= WG * CH (tuning.sampleChunks: 'auto' on
// GPUs; on SwiftShader, CPU emulation, its 75 workgroups a row cost more than one).
const CH = 2048u; // tokens a chunk: 8 a thread at WG = 256 (the host runs these entries at 256)
@group(0) @binding(1) var<storage, read_write> chunkOut: array<vec2u>; // sample_chunks: (B, chunks)
@group(0) @binding(4) var<storage, read> chunkIn: array<vec2u>;        // sample_pick: the same
var<workgroup> pickChunk: u32;
var<workgroup> pickBefore: f32;
var<workgroup> pickR: f32;

fn chunkCount() -> u32 { return (p.V + CH - 1u) / CH; }

@compute @workgroup_size(WG)
fn sample_chunks(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  let nch = chunkCount();
  let w = linearGroup(wid, nwg);
  if (w >= p.B * nch) { return; } // a whole workgroup (uniform)
  let base = (w / nch) * p.V;
  let t0 = (w % nch) * CH;
  let t1 = min(p.V, t0 + CH);
  if (p.temperature <= 0.0) {
    var bestV = LOWEST;
    var bestI = NONE;
    for (var i = t0 + l.lid; i < t1; i += WG) {
      let v = logits[base + i];
      if (bestI == NONE || v > bestV) { bestV = v; bestI = i; }
    }
    let best = argmaxIndex(bestV, bestI, l);
    if (l.lid == 0u) { chunkOut[w] = vec2u(bitcast<u32>(logits[base + best]), best); }
    return;
  }
  var mx = LOWEST;
  for (var i = t0 + l.lid; i < t1; i += WG) { mx = max(mx, logits[base + i] / p.temperature); }
  mx = maxF(mx, l);
  var s = 0.0;
  for (var i = t0 + l.lid; i < t1; i += WG) { s += exp(logits[base + i] / p.temperature - mx); }
  s = sumF(s, l);
  if (l.lid == 0u) { chunkOut[w] = vec2u(bitcast<u32>(mx), bitcast<u32>(s)); }
}

@compute @workgroup_size(WG)
fn sample_pick(@builtin(workgroup_id) wid: vec3u, @builtin(num_workgroups) nwg: vec3u, l: Lanes) {
  let row = linearGroup(wid, nwg);
  if (row >= p.B) { return; }
  let lid = l.lid;
  let nch = chunkCount(); // <= WG (the host's check)
  let base = row * p.V;
  var c = vec2u(bitcast<u32>(LOWEST), NONE);
  if (lid < nch) { c = chunkIn[row * nch + lid]; }
  if (p.temperature <= 0.0) {
    let best = argmaxIndex(bitcast<f32>(c.x), c.y, l);
    if (lid == 0u) { writePick(row, best, 0.0); }
    return;
  }
  let mc = bitcast<f32>(c.x);
  let mx = maxF(mc, l);
  var mass = 0.0;
  if (lid < nch) { mass = bitcast<f32>(c.y) * exp(mc - mx); }
  let total = sumF(mass, l);
  masses[lid] = mass;
  workgroupBarrier();
  if (lid == 0u) {
    let r = rowUniform(row) * total;
    let walked = walkMasses(nch, 0.0, r);
    pickChunk = walked.at;
    pickBefore = walked.before;
    pickR = r;
  }
  let chunk = workgroupUniformLoad(&pickChunk); // also orders thread 0's reads before the stores below
  let PER = CH / WG;
  let t0 = chunk * CH;
  let t1 = min(p.V, t0 + CH);
  let a = min(t1, t0 + lid * PER);
  let b = min(t1, a + PER);
  var own = 0.0;
  for (var i = a; i < b; i++) { own += exp(logits[base + i] / p.temperature - mx); }
  masses[lid] = own;
  workgroupBarrier();
  if (lid == 0u) {
    let r = pickR;
    let walked = walkMasses(WG, pickBefore, r); // r past this chunk's sum (rounding): its last
    var cum = walked.before;
    let ja = min(t1, t0 + walked.at * PER);
    let jb = min(t1, ja + PER);
    var pick = NONE;
    var lastKept = ja;
    for (var i = ja; i < jb; i++) {
      let e = exp(logits[base + i] / p.temperature - mx);
      if (e > 0.0) {
        lastKept = i;
        cum += e;
        if (cum > r) { pick = i; break; }
      }
    }
    let id = select(pick, lastKept, pick == NONE);
    writePick(row, id, (logits[base + id] / p.temperature - mx) - log(total));
  }
}
