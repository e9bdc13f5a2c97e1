// A deterministic random Qwen3 checkpoint in Hugging Face layout, for tests and the offline demo.
import { parseQwen3Config, weightNames, type Qwen3Config } from './config.ts';
import { f32ToBf16, writeSafetensors, type TensorToWrite } from './safetensors.ts';
import { mulberry32 } from './prng.ts';

export interface TinyCheckpointOptions {
  layers?: number; // L
  hidden?: number; // C
  heads?: number; // NH
  kvHeads?: number; // NKV
  headDim?: number; // HD
  intermediate?: number; // I
  vocab?: number; // V
  tied?: boolean;
  shards?: number;
  seed?: number;
  ropeTheta?: number;
  maxPositionEmbeddings?: number;
  /** Bytes (or text) of the real tokenizer.json / tokenizer_config.json; omitted files are not emitted. */
  tokenizerJson?: Uint8Array | string;
  tokenizerConfig?: Uint8Array | string;
}

export interface TinyCheckpoint {
  files: Map<string, Uint8Array | string>;
  config: Qwen3Config;
}

/** Standard normal via Box-Muller. */
function gaussian(rand: () => number): () => number {
  let spare: number | null = null;
  return () => {
    if (spare !== null) {
      const s = spare;
      spare = null;
      return s;
    }
    const u = 1 - rand();
    const v = rand();
    const r = Math.sqrt(-2 * Math.log(u));
    spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  };
}

function bf16Tensor(shape: number[], sample: () => number): Uint8Array {
  const n = shape.reduce((a, b) => a * b, 1);
  const bits = new Uint16Array(n);
  for (let i = 0; i < n; i++) bits[i] = f32ToBf16(sample());
  return new Uint8Array(bits.buffer);
}

/**
 * Init keeps hidden states O(1): embeddings ~N(0,1), each Linear ~N(0, 1/K) so outputs stay unit-scale,
 * and norm weights 1 + 0.1*N(0,1) so a kernel that ignores or misapplies them is caught.
 * The residual writers (o_proj, down_proj) are 4x larger: with tied random embeddings a weak
 * residual update makes every next token equal the current one, and the demo would only echo.
 */
function initStd(name: string, shape: number[]): number | 'norm' {
  if (name.endsWith('norm.weight')) return 'norm';
  if (name === 'model.embed_tokens.weight') return 1;
  const residualWriter = name.endsWith('o_proj.weight') || name.endsWith('down_proj.weight');
  return (residualWriter ? 4 : 1) / Math.sqrt(shape[1]!);
}

export function makeTinyCheckpoint(opts: TinyCheckpointOptions = {}): TinyCheckpoint {
  const L = opts.layers ?? 2;
  const C = opts.hidden ?? 64;
  const NH = opts.heads ?? 4;
  const NKV = opts.kvHeads ?? 2;
  const HD = opts.headDim ?? 16;
  const I = opts.intermediate ?? 128;
  const V = opts.vocab ?? 151936;
  const tied = opts.tied ?? true;
  const shards = opts.shards ?? 1;
  const seed = opts.seed ?? 0;

  const configJson = {
    architectures: ['Qwen3ForCausalLM'],
    attention_bias: false,
    attention_dropout: 0.0,
    bos_token_id: 151643,
    eos_token_id: 151645,
    head_dim: HD,
    hidden_act: 'silu',
    hidden_size: C,
    initializer_range: 0.02,
    intermediate_size: I,
    max_position_embeddings: opts.maxPositionEmbeddings ?? 4096,
    max_window_layers: L,
    model_type: 'qwen3',
    num_attention_heads: NH,
    num_hidden_layers: L,
    num_key_value_heads: NKV,
    rms_norm_eps: 1e-6,
    rope_scaling: null,
    rope_theta: opts.ropeTheta ?? 1_000_000,
    sliding_window: null,
    tie_word_embeddings: tied,
    torch_dtype: 'bfloat16',
    transformers_version: '4.51.0',
    use_cache: true,
    use_sliding_window: false,
    vocab_size: V,
  };
  const config = parseQwen3Config(configJson);

  const normal = gaussian(mulberry32(seed));
  const tensors: TensorToWrite[] = weightNames(config).map(({ name, shape }) => {
    const std = initStd(name, shape);
    const sample = std === 'norm' ? () => 1 + 0.1 * normal() : () => std * normal();
    return { name, dtype: 'BF16', shape, data: bf16Tensor(shape, sample) };
  });

  const files = new Map<string, Uint8Array | string>();
  files.set('config.json', JSON.stringify(configJson, null, 2));
  files.set(
    'generation_config.json',
    JSON.stringify(
      {
        bos_token_id: 151643,
        do_sample: true,
        eos_token_id: [151645, 151643],
        pad_token_id: 151643,
        temperature: 0.7,
        top_k: 20,
        top_p: 0.8,
        transformers_version: '4.51.0',
      },
      null,
      2,
    ),
  );
  if (opts.tokenizerJson !== undefined) files.set('tokenizer.json', opts.tokenizerJson);
  if (opts.tokenizerConfig !== undefined) files.set('tokenizer_config.json', opts.tokenizerConfig);

  if (shards <= 1) {
    files.set('model.safetensors', writeSafetensors(tensors, { format: 'pt' }));
    return { files, config };
  }
  if (!Number.isInteger(shards) || shards > tensors.length)
    throw new RangeError(`shards must be an integer in [1, ${tensors.length}], got ${shards}`);

  // Greedy split in load order: close a shard once it holds its share of the bytes, leaving one tensor per remaining shard at least.
  const totalSize = tensors.reduce((n, t) => n + t.data.byteLength, 0);
  const groups: TensorToWrite[][] = [[]];
  let groupBytes = 0;
  tensors.forEach((t, i) => {
    const remainingTensors = tensors.length - i;
    const remainingShards = shards - groups.length;
    const full = groupBytes >= totalSize / shards || remainingTensors === remainingShards;
    if (groups.at(-1)!.length > 0 && remainingShards > 0 && full) {
      groups.push([]);
      groupBytes = 0;
    }
    groups.at(-1)!.push(t);
    groupBytes += t.data.byteLength;
  });

  const weightMap: Record<string, string> = {};
  groups.forEach((group, g) => {
    const file = `model-${String(g + 1).padStart(5, '0')}-of-${String(groups.length).padStart(5, '0')}.safetensors`;
    files.set(file, writeSafetensors(group, { format: 'pt' }));
    for (const t of group) weightMap[t.name] = file;
  });
  files.set(
    'model.safetensors.index.json',
    JSON.stringify({ metadata: { total_size: totalSize }, weight_map: weightMap }, null, 2),
  );
  return { files, config };
}
