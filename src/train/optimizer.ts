// AdamW over every LoRA tensor on the GPU, with global grad-norm clipping, a learning-rate
// schedule, gradient accumulation over sequences, and skipping of non-finite steps.
import type { Gpu } from '../gpu/index.ts';
import type { LoraAdapter } from '../model/lora.ts';
import { badMoment, loraPrefix } from '../model/peft.ts';
import * as K from '../ops/index.ts';
import { clipScale, learningRate, type LrSchedule } from './schedule.ts';

export interface AdamWSettings {
  lr: number;
  beta1: number;
  beta2: number;
  eps: number;
  weightDecay: number;
  /** Global grad-norm clip; 0 = off. */
  maxGradNorm: number;
  schedule: LrSchedule;
}

export const DEFAULT_ADAMW: AdamWSettings = {
  lr: 1e-4,
  beta1: 0.9,
  beta2: 0.999,
  eps: 1e-8,
  weightDecay: 0,
  maxGradNorm: 1,
  schedule: { kind: 'constant' },
};

export interface StepReport {
  step: number; // optimizer steps taken (skipped ones not counted)
  lr: number;
  /** Norm of the averaged gradient before clipping. */
  gradNorm: number;
  skipped: boolean;
  reason?: string;
}

interface Moments {
  mA: GPUBuffer;
  vA: GPUBuffer;
  mB: GPUBuffer;
  vB: GPUBuffer; // f32, same shapes as A and B
}

export class LoraAdamW {
  step = 0;
  private readonly moments: Moments[];
  private readonly norms: GPUBuffer; // (1) f32 sum of squares of all gradients

  constructor(
    readonly gpu: Gpu,
    readonly lora: LoraAdapter,
    readonly settings: AdamWSettings = DEFAULT_ADAMW,
  ) {
    const r = lora.settings.r;
    this.moments = lora.pairs.map((p) => {
      const m = {
        mA: gpu.createBuffer(r * p.K * 4, 'mA'),
        vA: gpu.createBuffer(r * p.K * 4, 'vA'),
        mB: gpu.createBuffer(p.N * r * 4, 'mB'),
        vB: gpu.createBuffer(p.N * r * 4, 'vB'),
      };
      for (const b of Object.values(m)) gpu.clear(b);
      return m;
    });
    this.norms = gpu.createBuffer(4, 'gradSumSquares');
  }

  /**
   * Applies one update from gradients accumulated over `sequences` backward passes, then zeroes
   * them. A NaN or Inf gradient skips the update (and is reported).
   */
  async update(sequences = 1): Promise<StepReport> {
    const { gpu, lora, settings } = this;
    const r = lora.settings.r;
    gpu.clear(this.norms);
    for (const p of lora.pairs) {
      K.sumSquares(gpu, this.norms, p.dA, r * p.K, 0);
      K.sumSquares(gpu, this.norms, p.dB, p.N * r, 0);
    }
    const [sumSq] = await gpu.readF32(this.norms, 1);
    const gradNorm = Math.sqrt(sumSq) / sequences;
    const next = this.step + 1;
    const lr = learningRate(settings.lr, settings.schedule, next);
    if (!Number.isFinite(gradNorm)) {
      lora.zeroGrad();
      return { step: this.step, lr, gradNorm, skipped: true, reason: 'non-finite gradient (NaN or Inf): step skipped' };
    }
    const gradScale = (settings.maxGradNorm > 0 ? clipScale(gradNorm, settings.maxGradNorm) : 1) / sequences;
    const hp = {
      lr,
      beta1: settings.beta1,
      beta2: settings.beta2,
      eps: settings.eps,
      weightDecay: settings.weightDecay,
      step: next,
      gradScale,
    };
    lora.pairs.forEach((p, i) => {
      const m = this.moments[i];
      K.adamw(gpu, p.A, p.dA, m.mA, m.vA, r * p.K, hp);
      K.adamw(gpu, p.B, p.dB, m.mB, m.vB, p.N * r, hp);
    });
    lora.weightsChanged();
    lora.zeroGrad();
    this.step = next;
    return { step: next, lr, gradNorm, skipped: false };
  }

  /** First and second moments keyed like the adapter's tensors (`<prefix>.lora_A.weight`). */
  async getState(): Promise<{ step: number; m: Map<string, Float32Array>; v: Map<string, Float32Array> }> {
    const m = new Map<string, Float32Array>(),
      v = new Map<string, Float32Array>();
    const r = this.lora.settings.r;
    for (const [i, p] of this.lora.pairs.entries()) {
      const pre = loraPrefix(p.layer, p.target),
        mo = this.moments[i];
      m.set(`${pre}.lora_A.weight`, await this.gpu.readF32(mo.mA, r * p.K));
      v.set(`${pre}.lora_A.weight`, await this.gpu.readF32(mo.vA, r * p.K));
      m.set(`${pre}.lora_B.weight`, await this.gpu.readF32(mo.mB, p.N * r));
      v.set(`${pre}.lora_B.weight`, await this.gpu.readF32(mo.vB, p.N * r));
    }
    return { step: this.step, m, v };
  }

  /** Loads saved moments; refuses (before writing anything) a bad step or a non-finite or negative moment. */
  setState(state: { step: number; m: ReadonlyMap<string, Float32Array>; v: ReadonlyMap<string, Float32Array> }): void {
    if (!Number.isSafeInteger(state.step) || state.step < 0)
      throw new RangeError(`optimizer state: step must be an integer >= 0, got ${state.step}`);
    const bad = badMoment(state.m, state.v);
    if (bad) throw new RangeError(`optimizer state: tensor "${bad.tensor}": ${bad.message}`);
    for (const [i, p] of this.lora.pairs.entries()) {
      const pre = loraPrefix(p.layer, p.target),
        mo = this.moments[i];
      const put = (buf: GPUBuffer, from: ReadonlyMap<string, Float32Array>, key: string, what: string) => {
        const t = from.get(key);
        if (!t || t.byteLength !== buf.size)
          throw new Error(`optimizer state: ${what} of ${key} is missing or has the wrong size`);
        this.gpu.write(buf, t);
      };
      put(mo.mA, state.m, `${pre}.lora_A.weight`, 'exp_avg');
      put(mo.vA, state.v, `${pre}.lora_A.weight`, 'exp_avg_sq');
      put(mo.mB, state.m, `${pre}.lora_B.weight`, 'exp_avg');
      put(mo.vB, state.v, `${pre}.lora_B.weight`, 'exp_avg_sq');
    }
    this.step = state.step;
  }

  destroy(): void {
    for (const m of this.moments) for (const b of Object.values(m)) this.gpu.releaseBuffer(b);
    this.gpu.releaseBuffer(this.norms);
  }
}
