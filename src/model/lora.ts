// LoRA adapters on the GPU: y = x W^T + s * (x A^T) B^T for any subset of the seven Qwen3
// projections. A (r, K), B (N, r), their gradients and AdamW moments are f32 buffers laid out
// from one table of (layer, target) entries.
import type { Gpu } from '../gpu/index.ts';
import type { Qwen3Config } from './config.ts';
import * as K from '../ops/index.ts';
import { loraPrefix, loraScale, targetDims, type LoraConfig, type LoraTarget } from './peft.ts';

export { LORA_TARGETS, type LoraTarget, type LoraConfig } from './peft.ts';

export interface LoraPair {
  layer: number;
  target: LoraTarget;
  N: number;
  K: number;
  A: GPUBuffer; // (r, K) f32
  B: GPUBuffer; // (N, r) f32
  dA: GPUBuffer; // (r, K) f32
  dB: GPUBuffer; // (N, r) f32
}

/** A group's A matrices stacked (G r, K) and B matrices stacked (sum of N, r): LoraAdapter.packed. */
export interface PackedLora {
  A: GPUBuffer;
  B: GPUBuffer;
}

/** One adapter on the GPU. `enabled = false` gives the base model (the KL reference policy). */
export class LoraAdapter {
  readonly pairs: LoraPair[] = [];
  readonly byLayer: Map<LoraTarget, LoraPair>[] = [];
  readonly scale: number;
  enabled = true;
  /** Bumped by every write of A or B (setWeights, weightsChanged): packed copies older than it are refreshed. */
  private version = 0;
  private readonly packs = new Map<string, PackedLora & { version: number }>();

  constructor(
    readonly gpu: Gpu,
    readonly cfg: Qwen3Config,
    readonly settings: LoraConfig,
  ) {
    const { r } = settings;
    if (!Number.isInteger(r) || r < 1) throw new RangeError(`LoRA rank must be a positive integer (got ${r})`);
    this.scale = loraScale(settings);
    for (let l = 0; l < cfg.numLayers; l++) {
      const m = new Map<LoraTarget, LoraPair>();
      for (const target of settings.targetModules) {
        const { out: N, in: Kin } = targetDims(cfg, target);
        const name = `lora.${l}.${target}`;
        const pair: LoraPair = {
          layer: l,
          target,
          N,
          K: Kin,
          A: gpu.createBuffer(r * Kin * 4, `${name}.A`),
          B: gpu.createBuffer(N * r * 4, `${name}.B`),
          dA: gpu.createBuffer(r * Kin * 4, `${name}.dA`),
          dB: gpu.createBuffer(N * r * 4, `${name}.dB`),
        };
        m.set(target, pair);
        this.pairs.push(pair);
      }
      this.byLayer.push(m);
    }
    this.zeroGrad();
  }

  get(layer: number, t: LoraTarget): LoraPair | undefined {
    return this.enabled ? this.byLayer[layer].get(t) : undefined;
  }

  /** Number of trainable parameters. */
  get numParams(): number {
    return this.pairs.reduce((n, p) => n + this.settings.r * (p.K + p.N), 0);
  }

  zeroGrad(): void {
    for (const p of this.pairs) {
      this.gpu.clear(p.dA);
      this.gpu.clear(p.dB);
    }
  }

  /** Uploads A and B from PEFT-keyed f32 arrays (missing keys are an error). */
  setWeights(tensors: ReadonlyMap<string, Float32Array>): void {
    for (const p of this.pairs) {
      const pre = loraPrefix(p.layer, p.target);
      const a = tensors.get(`${pre}.lora_A.weight`),
        b = tensors.get(`${pre}.lora_B.weight`);
      if (!a || !b) throw new Error(`LoRA tensor ${pre}.lora_${a ? 'B' : 'A'}.weight is missing`);
      if (a.length !== this.settings.r * p.K || b.length !== p.N * this.settings.r)
        throw new Error(`LoRA tensor ${pre}: wrong size`);
      this.gpu.write(p.A, a);
      this.gpu.write(p.B, b);
    }
    this.weightsChanged();
  }

  /** Says that A or B changed on the GPU (the optimizer's step): packed copies refresh before their next use. */
  weightsChanged(): void {
    this.version++;
  }

  /**
   * The A and B matrices of these targets of a layer stacked in target order (A (G r, K), B (sum of
   * N, r)), for a group product whose LoRA branches bind packed (K.groupLoraPacks: one u over the
   * stacked A, one stacked B). Kept per layer and group, and copied again (in order with the
   * dispatches, before the caller's) after the weights change. Undefined unless every target has
   * a branch.
   */
  packed(layer: number, targets: readonly LoraTarget[]): PackedLora | undefined {
    const pairs = targets.map((t) => this.get(layer, t));
    if (pairs.some((p) => !p)) return undefined;
    const ps = pairs as LoraPair[];
    const r = this.settings.r;
    const key = `${layer}:${targets.join(',')}`;
    let pack = this.packs.get(key);
    if (!pack) {
      const name = `lora.${layer}.${targets.join('+')}`;
      pack = {
        A: this.gpu.createBuffer(
          ps.reduce((n, p) => n + r * p.K * 4, 0),
          `${name}.A`,
        ),
        B: this.gpu.createBuffer(
          ps.reduce((n, p) => n + p.N * r * 4, 0),
          `${name}.B`,
        ),
        version: -1,
      };
      this.packs.set(key, pack);
    }
    if (pack.version !== this.version) {
      let a = 0,
        b = 0;
      for (const p of ps) {
        this.gpu.copy(p.A, 0, pack.A, a, r * p.K * 4);
        this.gpu.copy(p.B, 0, pack.B, b, p.N * r * 4);
        a += r * p.K * 4;
        b += p.N * r * 4;
      }
      pack.version = this.version;
    }
    return pack;
  }

  /** Reads A and B (or, with `grads`, dA and dB) back as PEFT-keyed f32 arrays. */
  async getTensors(which: 'weights' | 'grads' = 'weights'): Promise<Map<string, Float32Array>> {
    const out = new Map<string, Float32Array>();
    for (const p of this.pairs) {
      const pre = loraPrefix(p.layer, p.target);
      out.set(`${pre}.lora_A.weight`, await this.gpu.readF32(which === 'weights' ? p.A : p.dA, this.settings.r * p.K));
      out.set(`${pre}.lora_B.weight`, await this.gpu.readF32(which === 'weights' ? p.B : p.dB, p.N * this.settings.r));
    }
    return out;
  }

  destroy(): void {
    for (const p of this.pairs) for (const b of [p.A, p.B, p.dA, p.dB]) this.gpu.releaseBuffer(b);
    for (const pack of this.packs.values()) for (const b of [pack.A, pack.B]) this.gpu.releaseBuffer(b);
    this.packs.clear();
    this.pairs.length = 0;
    this.byLayer.length = 0;
  }
}

/**
 * out (T,N) += s * (x A^T) B^T, the LoRA branch of a projection. `u` (T, r) receives x A^T
 * (kept for the backward when the caller passes its own buffer).
 */
export function loraForward(
  gpu: Gpu,
  out: GPUBuffer,
  u: GPUBuffer,
  x: GPUBuffer,
  p: LoraPair,
  T: number,
  r: number,
  scale: number,
): void {
  K.matmulF32(gpu, u, x, p.A, T, r, p.K);
  K.matmulF32(gpu, out, u, p.B, T, p.N, r, true, scale);
}

/**
 * Backward of the LoRA branch up to its input gradient: dB += s dy^T u; du = s dy B (`du` (T, r)
 * is scratch); dA += du^T x. The caller adds dx += du A, in the base weight's input-gradient
 * product (K.matmulBackwardInput's `lora`: { u: du, B: p.A, r, scale: 1 }).
 */
export function loraBackwardWeights(
  gpu: Gpu,
  du: GPUBuffer,
  dy: GPUBuffer,
  x: GPUBuffer,
  u: GPUBuffer,
  p: LoraPair,
  T: number,
  r: number,
  scale: number,
): void {
  K.matmulBackwardWeightF32(gpu, p.dB, dy, u, T, p.N, r, scale);
  K.matmulBackwardInputF32(gpu, du, dy, p.B, T, p.N, r, false, scale);
  K.matmulBackwardWeightF32(gpu, p.dA, du, x, T, r, p.K);
}
