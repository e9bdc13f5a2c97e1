// Seeded PRNG for the game: xoshiro128** (Blackman & Vigna) with a 128-bit state that
// serializes to four uint32s, so a checkpoint resumes the identical sequence.
// fork(label) derives an independent stream without advancing the parent, so each concern
// (roles, masking, sampling seeds, votes) draws from its own stream and adding a draw to one
// never shifts another.

/** Four uint32 words; never all zero. */
export type RngState = readonly [number, number, number, number];

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/** murmur3 finaliser: a bijective avalanche on 32 bits. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** FNV-1a over UTF-16 code units. */
function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** splitmix32 stream: fills a state from one 32-bit seed with well-spread words. */
function expandSeed(seed0: number, seed1: number): [number, number, number, number] {
  let x = (seed0 ^ fmix32(seed1 + 0x9e3779b9)) >>> 0;
  const out: [number, number, number, number] = [0, 0, 0, 0];
  for (let i = 0; i < 4; i++) {
    x = (x + 0x9e3779b9) >>> 0;
    out[i] = fmix32(x ^ rotl(seed1, 8 * i + 1));
  }
  if ((out[0] | out[1] | out[2] | out[3]) === 0) out[0] = 1; // the all-zero state is a fixed point
  return out;
}

function isWord(x: unknown): x is number {
  return typeof x === 'number' && Number.isInteger(x) && x >= 0 && x <= 0xffffffff;
}

export class Rng {
  private readonly s: Uint32Array;

  private constructor(words: readonly number[]) {
    this.s = Uint32Array.from(words);
  }

  /** A non-negative safe integer or any string (hashed). */
  static fromSeed(seed: number | string): Rng {
    if (typeof seed === 'string') return new Rng(expandSeed(hashString(seed), hashString(`#${seed}`)));
    if (!Number.isSafeInteger(seed) || seed < 0)
      throw new RangeError(`Rng seed must be a non-negative safe integer or a string, got ${seed}`);
    return new Rng(expandSeed(seed >>> 0, Math.floor(seed / 2 ** 32) >>> 0));
  }

  static fromState(state: RngState): Rng {
    if (!Array.isArray(state) || state.length !== 4 || !state.every(isWord)) {
      throw new RangeError(`Rng state must be four uint32 words, got ${JSON.stringify(state)}`);
    }
    if (state.every((w) => w === 0)) throw new RangeError('Rng state must not be all zero');
    return new Rng(state);
  }

  /** A copy of the state: Rng.fromState(r.state()) continues exactly where r is. */
  state(): RngState {
    return [this.s[0]!, this.s[1]!, this.s[2]!, this.s[3]!];
  }

  nextUint32(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5) >>> 0, 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2] ^= s[0]!;
    s[3] ^= s[1]!;
    s[1] ^= s[2]!;
    s[0] ^= s[3]!;
    s[2] ^= t;
    s[3] = rotl(s[3]!, 11);
    return result;
  }

  /** Uniform in [0, 1) with 53 random bits. */
  next(): number {
    const hi = this.nextUint32() >>> 5; // 27 bits
    const lo = this.nextUint32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }

  /** Uniform integer in [0, n), unbiased (rejection sampling). */
  int(n: number): number {
    if (!Number.isSafeInteger(n) || n <= 0 || n > 2 ** 32)
      throw new RangeError(`Rng.int needs an integer in 1..2^32, got ${n}`);
    const limit = 2 ** 32 - (2 ** 32 % n); // largest multiple of n that fits
    for (;;) {
      const x = this.nextUint32();
      if (x < limit) return x % n;
    }
  }

  /** A shuffled copy (Fisher-Yates). */
  shuffle<T>(items: readonly T[]): T[] {
    const out = items.slice();
    for (let i = out.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      const tmp = out[i]!;
      out[i] = out[j]!;
      out[j] = tmp;
    }
    return out;
  }

  /** An independent stream named `label`; the parent does not advance. */
  fork(label: string): Rng {
    const h = hashString(label);
    const s = this.s;
    const words = [0, 1, 2, 3].map(
      (i) => fmix32((s[i]! ^ fmix32(h + Math.imul(i + 1, 0x9e3779b9))) >>> 0) ^ rotl(s[(i + 1) & 3]!, 13),
    );
    const mixed = expandSeed(
      fmix32((words[0]! ^ words[2]!) >>> 0),
      fmix32((words[1]! ^ words[3]! ^ hashString(`${label}/fork`)) >>> 0),
    );
    // Fold all four parent words in so two parents differing in any word fork differently.
    const out = mixed.map((w, i) => (w ^ words[i]!) >>> 0);
    if (!out.some((w) => w !== 0)) out[0] = 1;
    return new Rng(out);
  }
}
