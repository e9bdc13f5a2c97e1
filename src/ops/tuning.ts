// The kernel variant switches: their names, choices and defaults, and the `name=value,...` text
// form that the CLI's --kernels and the app's "Kernel variants" field take. Pure (no GPU): the
// store and UI import it; the live settings are `tuning` in ./common.ts.

/** The kernel variant switches ('auto' everywhere by default: each op picks for the adapter). */
export interface Tuning {
  /**
   * 'auto': on CPU adapters (SwiftShader) the barrier-free 'blocks' matmul (shaders/gemv.wgsl
   * gemv_rows: 16-byte weight loads, 2-5x less CPU time than 'rows' there at 4B shapes) where the
   * rows are 16-byte aligned, else the word-by-word 'rows' (~10x the others there); on GPUs for
   * T <= GEMV_MAX_T 'lanes' (shaders/gemv.wgsl gemv_lanes: 16-byte weight loads, x staged in
   * workgroup memory) where the rows are 16-byte aligned, else 'gemv' (shaders/matmul.wgsl
   * matmul_gemv, word by word); 'tiled' for more rows. Tests force each ('blocks' falls back to
   * 'rows' and 'lanes' to 'gemv' when unaligned).
   */
  matmul: 'auto' | 'rows' | 'blocks' | 'lanes' | 'gemv' | 'tiled';
  /**
   * Attention over the KV cache: one workgroup per (token, head group) ('single'), split over the
   * key length ('split': attention_split, a thread a key), split with each key's row read by
   * several lanes together ('lanes': attention_lanes, needs subgroups; src/ops/forward.ts
   * attentionLanes), or query tiles ('tiled'). 'auto': 'lanes' for decode on GPUs where it runs,
   * else 'split' there; 'single' on CPU adapters; 'tiled' from the adapter's tiled length on.
   */
  attention: 'auto' | 'single' | 'split' | 'lanes' | 'tiled';
  /** Paged attention_forward / attention_split: a GQA group's heads per workgroup ('auto', 'group') or one head ('one'). */
  attentionHeads: 'auto' | 'group' | 'one';
  /**
   * The forward matmul's tiled GEMM with f16 tiles and packed f16 products (shaders/matmul.wgsl
   * F16): 'auto' takes it on GPUs with shader-f16 (not on CPU adapters, which emulate f16),
   * 'on' wherever the device has shader-f16 (an error where it has not), 'off' never.
   */
  gemmF16: 'auto' | 'on' | 'off';
  /**
   * The tiled GEMM with A shared through subgroup shuffles instead of a shared-memory tile
   * (shaders/matmul.wgsl SGA; products whose A is read along r, i.e. every one but the LoRA weight
   * gradient): 'auto' takes it on Intel GPUs with subgroups (where onnxruntime-web's WebGPU
   * backend also enables its subgroup matmul: a register broadcast there is cheaper than shared
   * memory), 'on' wherever the device has subgroups (an error where it has not), 'off' never.
   */
  gemmSubgroups: 'auto' | 'on' | 'off';
  /**
   * The tiled GEMM with 16-byte global loads (shaders/matmul.wgsl VEC) for products whose A is
   * read along r with 16-byte aligned rows: B read along r (the forward matmul x . W^T and the LoRA
   * forward; R % 8 == 0) or along n (define BT: the input gradients dy . W; N % 8 == 0). 'auto'
   * wherever it fits (the SGA variant, where it runs, keeps its own loads), 'off' never (the
   * r-major tiles, element loads; the LoRA weight gradients always take those).
   */
  gemmVec4: 'auto' | 'off';
  /**
   * The tiled GEMM sliced over R (shaders/matmul.wgsl SPLITK, src/ops/splitK.ts) when its 64 x 128
   * output tiles alone make few workgroups (the LoRA A products, N = r; the LM head's input
   * gradient over 64-row chunks): the slices' partial outputs are summed by a second pass.
   * 'auto' where the tiles make fewer than 128 workgroups, on GPUs; 'on' wherever two slices fit
   * (tests); 'off' never.
   */
  gemmSplitK: 'auto' | 'on' | 'off';
  /**
   * The tiled GEMM over q4 weights with the weight dequantized first into a pooled f32 copy
   * (shaders/quant.wgsl dequantize_q4, src/ops/q4Dequant.ts), then multiplied by the f32-weight
   * tile instead of the tile that dequantizes on the fly: the same values, the same sums. 'on' for
   * products of at least 128 rows (prefill chunks, the training pass) whose copy fits 128 MiB (not
   * the LM head); 'auto' and 'off' never, until a GPU run times it (src/ops/q4Dequant.ts says why).
   */
  gemmQ4Dequant: 'auto' | 'on' | 'off';
  /**
   * The tiled GEMM's rows per output tile where it takes 16-byte loads (shaders/matmul.wgsl VEC):
   * '64' (64 x 128, 4 x 8 outputs a thread) or '128' (define TM8: 128 x 128, 8 x 8 a thread: half
   * the shared reads per FMA, each weight element loaded and dequantized once per 128 rows, half
   * as many workgroups; needs 20 KiB of workgroup memory, else 64). Split-K counts the tile it
   * runs. 'auto' takes 64 until a GPU run times 128 (scripts/device-run.sh profiles both).
   */
  gemmTile: 'auto' | '64' | '128';
  /**
   * The decode GEMV (shaders/gemv.wgsl gemv_lanes) split over K when its columns alone make few
   * workgroups and each lane would walk a long row (the LoRA A products of o_proj and down_proj in
   * decode on GPUs: N = r columns, one workgroup; src/ops/colsSplit.ts lanesSplit): each slice of
   * K is a workgroup of its own, and gemv_cols_reduce adds the slices' partial sums in order.
   * 'auto' on GPUs wherever gemv_lanes runs one weight without a LoRA epilogue (within f32
   * rounding of the unsplit sum; never on CPU adapters, where SwiftShader runs each extra
   * workgroup's barriers serially: 4-8x slower there), 'off' never.
   */
  gemvSplitK: 'auto' | 'off';
  /**
   * The decode GEMV (shaders/gemv.wgsl gemv_lanes) with more threads per column, up to 64, where
   * its columns alone make few workgroups and its rows are long enough to share out (src/ops/
   * colsSplit.ts wideLanes): a product that does not split over K (the LoRA A products of a q/k/v
   * or gate/up group, r columns each, whose folded norm needs the whole row in one workgroup)
   * then runs up to 4 times the workgroups, each lane walking a quarter of the blocks. 'auto' on
   * GPUs (never on CPU adapters, which run more workgroups' barriers serially), 'on' wherever
   * gemv_lanes runs (tests), 'off' never. Within f32 rounding of the narrower layout (the sums
   * over a row's blocks in another order).
   */
  gemvWideLanes: 'auto' | 'on' | 'off';
  /**
   * The decode GEMV's (gemv_lanes) threads per output column before any widening (gemvWideLanes):
   * 'auto' about 8 16-byte blocks a lane, 4 to 16 lanes (at Qwen3-4B: 8 for the q4 projections
   * over K = 2,560, 16 for bf16 and for down_proj), COLS = 256 / LANES columns a workgroup sharing
   * one staged copy of x; '4', '8' or '16' force it (fewer lanes: more columns share each staged
   * x, each lane walks more blocks). For a GPU's A/B (the H100's decode GEMVs of 2026-12-06 ran
   * at about 200 GB/s, 7% of its copy rate, with as many bytes of x staged per workgroup as of
   * weights at B = 4); within f32 rounding of 'auto' (the sums over a row's blocks in another order).
   */
  gemvLanes: 'auto' | '4' | '8' | '16';
  /**
   * The decode GEMV's (gemv_lanes) output columns a thread (shaders/gemv.wgsl CPT): each part of x
   * read from workgroup memory then serves that many columns' weights, with the lanes a column
   * multiplied by as much, so a workgroup keeps its columns and the grid its workgroups
   * (src/ops/colsSplit.ts colsPerThread). At one column a thread a q4 block's 16 bytes cost 128
   * bytes of x reads a row of x (512 at B = 4), more than an SM's workgroup memory serves per
   * byte of an HBM GPU's weights. 'auto' on GPUs the most of 4, 2 that keeps a column's lanes
   * within 32 and within one staging chunk's blocks (never on CPU adapters, which take gemv_rows);
   * '1' one column a thread (the kernel before, for a GPU's A/B); '2', '4' force it where gemv_lanes
   * runs unsplit (lanes up to 64). Bitwise the same sums as one column a thread at the same lanes.
   */
  gemvCols: 'auto' | '1' | '2' | '4';
  /**
   * The tiled attention backward: register-tiled products ('blocks': attention_blocked_dq / _dkv,
   * as attentionForward's 'blocks'; head_dim a multiple of 32 and the workgroup memory to hold
   * them), or rows split over 4 threads each with subgroup sums ('split': shaders/attention.wgsl
   * SPLIT, where subgroups are at least 4 wide), or one thread per row ('row'). 'auto': on GPUs
   * 'blocks' where they fit (an H100 ran them 3.3-5x faster than 'split' at Qwen3-4B heads,
   * src/ops/attentionTiled.ts ATTENTION_BLOCKED_MIN_T_GPU), else 'split' where it can run; on CPU
   * adapters 'row'.
   */
  attentionBackward: 'auto' | 'split' | 'row' | 'blocks';
  /**
   * With the blocked backward (attentionBackward 'blocks', or its 'auto' on GPUs), the dK/dV
   * kernel's most keys a thread (attention_blocked_dkv's RI, never more than the geometry
   * attentionBlocking picks; its workgroup owns 16 RI keys): '4' (the geometry's at Qwen3-4B heads
   * where the workgroup memory takes it: two accumulators of 4 x HD/32 vec4s and two 4 x 4 blocks
   * a thread, about 200 registers at head_dim 128), '2' or '1' (half or a quarter of those
   * registers, 2 or 4 times the workgroups, each Q/dO tile serving fewer keys). 'auto': '2' on
   * GPUs (an H100's backward 1.1-1.4x faster than at 4, bench/attention-ab.ts --variants
   * tiled:blocks,tiled:blocks2), the geometry's on CPU adapters.
   */
  attentionDkvRows: 'auto' | '4' | '2' | '1';
  /**
   * The tiled dK/dV pass's keys a workgroup (attention_tiled_dkv, rows or split): 'auto' on GPUs
   * the query tile's tokens (BQ: as many workgroups as the dQ pass; at Qwen3-4B heads 32 keys, 128
   * threads with the split rows), at least 64 threads; 'wide' (and 'auto' on CPU adapters) a
   * whole tile's worth, ROWS / split (128 keys: at T = 512, 32 workgroups for the H200's 132
   * multiprocessors, where its dK/dV took 13.4 ms a layer against dQ's 2.4).
   */
  attentionDkvGroup: 'auto' | 'wide';
  /**
   * The tiled attention forwards, training with lse and prefill over the paged cache (where
   * attention picks the tiled kernels): one thread per (query, head) row ('rows':
   * attention_tiled_lse, attention_tiled), or register-tiled products ('blocks':
   * attention_blocked_lse, attention_blocked; S = Q K^T and O = P V each a 4 x 4 / 4 x HD/32 block
   * a thread, as the tiled GEMM; head_dim a multiple of 32, else 'rows'). 'auto': 'blocks' on
   * GPUs where they fit (an H100 ran them 5.7-7x faster than 'rows' at Qwen3-4B heads,
   * src/ops/attentionTiled.ts ATTENTION_BLOCKED_MIN_T_GPU), 'rows' on CPU adapters.
   */
  attentionForward: 'auto' | 'rows' | 'blocks';
  /**
   * The decoder layers' two RMSNorms folded into the fused q/k/v and gate/up GEMVs and their LoRA
   * A products (shaders/gemv.wgsl NORM: each GEMV workgroup sums the squares of the x it stages
   * and scales its sums by the row's rstd; within f32 rounding of the separate norm): 'auto'
   * wherever those run gemv_lanes (decode on GPUs), 'off' never.
   */
  normFold: 'auto' | 'off';
  /**
   * A LoRA branch's B product added in its projection's GEMV store (shaders/gemv.wgsl LORA: the
   * o_proj and down_proj products, whose A product ran before; one dispatch instead of two, within
   * f32 rounding of the separate product, whose sum over r runs in another order): 'auto' wherever
   * matmul takes gemv_rows or gemv_lanes (decode), 'off' never. The q/k/v and gate/up groups' too
   * (K.matmulGroup): each branch's u and B bound where they fit the device's storage buffers a
   * stage, else packed (one u over the stacked A matrices, one stacked B: LoraAdapter.packed);
   * 'packed' packs them wherever they fold (to test the packed kernels on any device). Also the
   * tiled GEMM's (prefill, the training pass): a branch's B product added in the forward
   * product's store, and its part of the input gradient (du . A) in the base input gradient's
   * (shaders/matmul.wgsl LORA), where the 16-byte-load tiles run; 'off' runs them as products of
   * their own.
   */
  loraFold: 'auto' | 'off' | 'packed';
  /**
   * The q/k/v and gate/up groups' LoRA A products (u = rmsNorm(x) A^T) begun in the GEMV that
   * writes x: the previous layer's down_proj for q/k/v, o_proj for gate/up (shaders/gemv.wgsl
   * NEXTA): each of its workgroups adds up its own columns' share of u before the norm's rstd, and
   * the group's GEMV adds the shares up, scales them by the rstd it computes anyway and takes the B
   * products in its store (UPART). Two dispatches fewer a layer (one in the first), within f32
   * rounding. 'auto' where the norm and the LoRA B products fold (decode on GPUs) and the bindings
   * fit (q/k/v's branches packed: 10 storage buffers, Chrome's limit; gate/up's each with its own
   * B: 9), 'off' never. With it, o_proj's and down_proj's own A products, where they split over K
   * (Qwen3-4B's widths: tuning.gemvSplitK), leave their slices' partial sums to the projection's
   * GEMV, which adds them up as it takes the B product (K.matmul's `lora.A`, UPART on gemv_lanes):
   * two dispatches fewer a layer again, the reduces'; and where the decode attention splits over
   * the keys, its attention_combine begins o_proj's A product (K.AttentionAProduct, APART), which
   * o_proj's GEMV adds up: one fewer again; and where down_proj is adapted with the SwiGLU folded,
   * the gate/up GEMV pairs its columns (its branches packed) and begins down_proj's A product
   * (K.PairAProduct, PAIR; 10 bindings): one fewer again.
   */
  loraAFold: 'auto' | 'off';
  /**
   * The MLP's SwiGLU activation, silu(gate) * up, formed inside down_proj's GEMV and its LoRA A
   * product as they stage x (shaders/gemv.wgsl SILU; the same expression, so bitwise the separate
   * kernel's products), one dispatch fewer per layer and no activation written: 'auto' wherever
   * those run gemv_lanes (decode on GPUs), 'off' never.
   */
  siluFold: 'auto' | 'off';
  /**
   * Sampling without top-k and top-p (a SpyRL round's, which training requires) and greedy over
   * chunks of the vocabulary, a workgroup each, then one workgroup a row picks the token
   * (shaders/sample.wgsl sample_chunks, sample_pick: two dispatches instead of one workgroup a row
   * walking all of it), where the vocabulary fits (V <= 256 x 2,048 tokens): 'auto' on GPUs (on
   * SwiftShader, CPU emulation, a Qwen3 row took 53 ms that way against 7 ms in one workgroup:
   * 75 workgroups' barriers and reductions; README), 'on' everywhere, 'off' never (the
   * one-workgroup kernel, which top-k and top-p always take).
   */
  sampleChunks: 'auto' | 'on' | 'off';
  /**
   * Whose choices 'auto' makes in the switches above: the adapter's own ('auto': CPU adapters,
   * i.e. SwiftShader, lavapipe, llvmpipe and WARP, get theirs, every other adapter a GPU's), or a
   * GPU's ('gpu') or a CPU adapter's ('cpu') whatever the adapter. 'gpu' runs the kernels a real
   * GPU would get on SwiftShader or lavapipe: npm test checks the model against PyTorch that way.
   * Forced 'gpu' choices are right on any adapter, only slower on a CPU one.
   */
  autoFor: 'auto' | 'gpu' | 'cpu';
}

/** Every switch's default. */
export const TUNING_DEFAULTS: Readonly<Tuning> = {
  matmul: 'auto',
  attention: 'auto',
  attentionHeads: 'auto',
  gemmF16: 'auto',
  gemmSubgroups: 'auto',
  gemmVec4: 'auto',
  gemmSplitK: 'auto',
  gemmQ4Dequant: 'auto',
  gemmTile: 'auto',
  gemvSplitK: 'auto',
  gemvWideLanes: 'auto',
  gemvLanes: 'auto',
  gemvCols: 'auto',
  attentionBackward: 'auto',
  attentionDkvRows: 'auto',
  attentionDkvGroup: 'auto',
  attentionForward: 'auto',
  normFold: 'auto',
  loraFold: 'auto',
  loraAFold: 'auto',
  siluFold: 'auto',
  sampleChunks: 'auto',
  autoFor: 'auto',
};

/** The values each switch takes ('auto' first: the default). */
export const TUNING_CHOICES: { readonly [K in keyof Tuning]: readonly Tuning[K][] } = {
  matmul: ['auto', 'rows', 'blocks', 'lanes', 'gemv', 'tiled'],
  attention: ['auto', 'single', 'split', 'lanes', 'tiled'],
  attentionHeads: ['auto', 'group', 'one'],
  gemmF16: ['auto', 'on', 'off'],
  gemmSubgroups: ['auto', 'on', 'off'],
  gemmVec4: ['auto', 'off'],
  gemmSplitK: ['auto', 'on', 'off'],
  gemmQ4Dequant: ['auto', 'on', 'off'],
  gemmTile: ['auto', '64', '128'],
  gemvSplitK: ['auto', 'off'],
  gemvWideLanes: ['auto', 'on', 'off'],
  gemvLanes: ['auto', '4', '8', '16'],
  gemvCols: ['auto', '1', '2', '4'],
  attentionBackward: ['auto', 'split', 'row', 'blocks'],
  attentionDkvRows: ['auto', '4', '2', '1'],
  attentionDkvGroup: ['auto', 'wide'],
  attentionForward: ['auto', 'rows', 'blocks'],
  normFold: ['auto', 'off'],
  loraFold: ['auto', 'off', 'packed'],
  loraAFold: ['auto', 'off'],
  siluFold: ['auto', 'off'],
  sampleChunks: ['auto', 'on', 'off'],
  autoFor: ['auto', 'gpu', 'cpu'],
};

/**
 * Settings from `name=value,...` (e.g. `gemmF16=off,attentionBackward=row`; blank: none): one
 * Error naming the part, switch or value that is wrong.
 */
export function parseTuning(spec: string): Partial<Tuning> {
  const out: Record<string, string> = {};
  for (const part of spec.split(',').map((x) => x.trim())) {
    if (!part) continue;
    const m = /^([A-Za-z0-9]+)=([A-Za-z0-9]+)$/.exec(part);
    if (!m) throw new Error(`"${part}" is not name=value (e.g. gemmF16=off)`);
    const [, name, value] = m as unknown as [string, string, string];
    if (!Object.hasOwn(TUNING_CHOICES, name)) {
      throw new Error(`no kernel switch "${name}": one of ${Object.keys(TUNING_CHOICES).join(', ')}`);
    }
    const choices = TUNING_CHOICES[name as keyof Tuning] as readonly string[];
    if (!choices.includes(value)) throw new Error(`${name} must be one of ${choices.join(', ')} (got "${value}")`);
    if (Object.hasOwn(out, name)) throw new Error(`${name} is given twice`);
    out[name] = value;
  }
  return out as Partial<Tuning>;
}

/** The `name=value,...` form of settings (switches in TUNING_CHOICES order; '' for none). */
export function formatTuning(settings: Partial<Tuning>): string {
  return (Object.keys(TUNING_CHOICES) as (keyof Tuning)[])
    .filter((k) => settings[k] !== undefined)
    .map((k) => `${k}=${settings[k]}`)
    .join(',');
}
