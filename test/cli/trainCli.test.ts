// `spyrl grad` against PyTorch autograd, and `spyrl sft`: it lowers the loss, writes a PEFT
// adapter with PEFT's exact keys, and a resumed run continues exactly where it stopped.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openSafetensorsModel } from '../../src/model/safetensors.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { ROOT, spyrl } from '../helpers/spyrl.ts';

async function tensors(dir: string, file: string): Promise<Map<string, { shape: number[]; data: Float32Array }>> {
  const src = nodeFolderSource(dir);
  const st = await openSafetensorsModel({
    exists: async (f) => f === 'model.safetensors',
    open: (f) => src.open(f === 'model.safetensors' ? file : f),
    readText: src.readText,
  });
  const out = new Map<string, { shape: number[]; data: Float32Array }>();
  for (const [name, info] of st.tensors) {
    const b = await st.readTensor(name);
    out.set(name, {
      shape: info.shape,
      data: new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)),
    });
  }
  return out;
}

let tmp: string;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-train-'));
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe('spyrl grad', () => {
  it('writes the gradient of every LoRA tensor, matching PyTorch autograd', async () => {
    const fix = join(ROOT, 'test/fixtures/golden-lora/untied-rslora');
    const ref = JSON.parse(await readFile(join(fix, 'loss.json'), 'utf8')) as {
      model_dir: string;
      tokens: number[];
      loss: number;
    };
    const out = join(tmp, 'grads.safetensors');
    const r = await spyrl(
      'grad',
      '--model',
      join(ROOT, ref.model_dir),
      '--adapter',
      fix,
      '--tokens',
      ref.tokens.join(','),
      '--out',
      out,
    );
    expect(r.code, r.stderr).toBe(0);
    const { loss } = JSON.parse(r.stdout) as { loss: number };
    expect(Math.abs(loss - ref.loss) / ref.loss).toBeLessThanOrEqual(1e-4);
    const got = await tensors(tmp, 'grads.safetensors');
    const want = await tensors(fix, 'grads.safetensors');
    expect([...got.keys()].sort()).toEqual([...want.keys()].sort());
    for (const [k, w] of want) {
      const g = got.get(k)!;
      expect(g.shape, k).toEqual(w.shape);
      let maxRef = 0,
        err = 0;
      for (let i = 0; i < w.data.length; i++) {
        maxRef = Math.max(maxRef, Math.abs(w.data[i]));
        err = Math.max(err, Math.abs(g.data[i] - w.data[i]));
      }
      expect(err, k).toBeLessThanOrEqual(1e-3 * maxRef + 1e-6);
    }
  });
});

describe('spyrl sft', () => {
  let model: string, text: string;
  const common = () => [
    '--model',
    model,
    '--text-file',
    text,
    '--seq-len',
    '16',
    '--batch',
    '1',
    '--lr',
    '0.01',
    '--r',
    '4',
    '--alpha',
    '8',
    '--targets',
    'q_proj,v_proj,o_proj,down_proj',
  ];
  const losses = (stdout: string) => [...stdout.matchAll(/loss ([\d.]+)/g)].map((m) => Number(m[1]));

  beforeAll(async () => {
    model = join(tmp, 'tiny');
    expect(
      (
        await spyrl(
          'tiny-model',
          '--out',
          model,
          '--layers',
          '1',
          '--hidden',
          '32',
          '--heads',
          '2',
          '--kv-heads',
          '1',
          '--intermediate',
          '64',
        )
      ).code,
    ).toBe(0);
    text = join(tmp, 'train.txt');
    // One short passage: 16-token windows repeat, so a working fine-tune must lower their loss.
    await writeFile(text, 'The spy saw a report with one fifth of it removed and wrote a summary. ');
  });

  it('lowers the loss, writes a PEFT adapter, and resumes exactly', async () => {
    const full = await spyrl('sft', ...common(), '--steps', '6', '--out', join(tmp, 'full'));
    expect(full.code, full.stderr).toBe(0);
    const l = losses(full.stdout);
    expect(l).toHaveLength(6);
    expect(l[5]).toBeLessThan(l[0] * 0.9);

    const cfg = JSON.parse(await readFile(join(tmp, 'full', 'adapter_config.json'), 'utf8'));
    expect(cfg).toMatchObject({
      peft_type: 'LORA',
      task_type: 'CAUSAL_LM',
      r: 4,
      lora_alpha: 8,
      lora_dropout: 0,
      bias: 'none',
      use_rslora: false,
      fan_in_fan_out: false,
    });
    expect([...cfg.target_modules].sort()).toEqual(['down_proj', 'o_proj', 'q_proj', 'v_proj']);
    const adapter = await tensors(join(tmp, 'full'), 'adapter_model.safetensors');
    expect([...adapter.keys()].sort()).toEqual([
      'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight',
      'base_model.model.model.layers.0.mlp.down_proj.lora_B.weight',
      'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight',
      'base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight',
      'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight',
      'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight',
      'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight',
      'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight',
    ]);
    expect(adapter.get('base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight')!.shape).toEqual([4, 32]);
    expect(adapter.get('base_model.model.model.layers.0.mlp.down_proj.lora_B.weight')!.shape).toEqual([32, 4]);
    expect(adapter.get('base_model.model.model.layers.0.mlp.down_proj.lora_B.weight')!.data.some((x) => x !== 0)).toBe(
      true,
    );

    // 3 steps, then resume to 6: the same adapter bit for bit.
    expect((await spyrl('sft', ...common(), '--steps', '3', '--out', join(tmp, 'half'))).code).toBe(0);
    const resumed = await spyrl(
      'sft',
      ...common(),
      '--steps',
      '6',
      '--resume',
      join(tmp, 'half'),
      '--out',
      join(tmp, 'resumed'),
      // 1 GiB: the passes keep the layer's activations instead of recomputing it, bit for bit the same.
      '--gpu-memory',
      '1',
    );
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(resumed.stdout).toContain("keeping 1 of 1 layers' activations (--gpu-memory)");
    expect(full.stdout).not.toContain('keeping');
    expect(losses(resumed.stdout)).toEqual(l.slice(3));
    const a = await tensors(join(tmp, 'full'), 'adapter_model.safetensors');
    const b = await tensors(join(tmp, 'resumed'), 'adapter_model.safetensors');
    for (const [k, t] of a)
      expect(Buffer.compare(Buffer.from(t.data.buffer), Buffer.from(b.get(k)!.data.buffer)), k).toBe(0);
  }, 600_000);

  it('logits --adapter applies the trained adapter', async () => {
    const base = join(tmp, 'base.f32'),
      tuned = join(tmp, 'tuned.f32');
    expect((await spyrl('logits', '--model', model, '--tokens', '1,2,3', '--out', base)).code).toBe(0);
    const r = await spyrl(
      'logits',
      '--model',
      model,
      '--tokens',
      '1,2,3',
      '--out',
      tuned,
      '--adapter',
      join(tmp, 'full'),
    );
    expect(r.code, r.stderr).toBe(0);
    expect(Buffer.compare(await readFile(base), await readFile(tuned))).not.toBe(0);
  });

  it('refuses a configuration that will not fit, saying what to change', async () => {
    const r = await spyrl('sft', ...common(), '--steps', '1', '--out', join(tmp, 'never'), '--gpu-memory', '0.001');
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/GPU memory.*(sequence length|smaller model)/);
  });
});
