#!/usr/bin/env bash
# Mesa's lavapipe (the Vulkan driver of llvmpipe, a CPU rasterizer) as a second software GPU for
# the kernel tests: unlike SwiftShader it offers shader-f16, so the f16 kernel variants run
# somewhere without a GPU. Debian 12's own Mesa (22.3) is too old for Dawn; this fetches
# mesa-vulkan-drivers (and the libdrm it wants) from Debian's bookworm-backports (Mesa 25) with
# apt itself, so the packages are checked against Debian's signed index, and unpacks them under
# .cache/lavapipe (git-ignored; nothing is installed system-wide). Prints the Vulkan ICD file to
# point VK_ICD_FILENAMES at; a second run reuses the unpacked copy.
#   VK_ICD_FILENAMES=$(bash scripts/lavapipe.sh) npx vitest run test/ops/gemmF16.test.ts
# The driver's shared-library dependencies (LLVM 15, xcb, wayland) are those of Debian's own
# mesa-vulkan-drivers package: `apt-get install mesa-vulkan-drivers` provides them (.ci/run does).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${LAVAPIPE_DIR:-$root/.cache/lavapipe}"
icd="$dir/lvp_icd.json"
fail() {
  echo "lavapipe.sh: $*" >&2
  exit 1
}

if [ ! -f "$icd" ]; then
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || fail "needs Debian's apt-get and dpkg-deb"
  # shellcheck disable=SC1091
  . /etc/os-release
  # bookworm's Mesa is 22.3 (Dawn rejects its lavapipe); later Debian releases ship a new enough one.
  suite="${VERSION_CODENAME:-}"
  [ "$suite" = bookworm ] && suite=bookworm-backports
  [ -n "$suite" ] || fail "no VERSION_CODENAME in /etc/os-release"
  work="$dir.tmp"
  rm -rf "$work" && mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  echo "deb http://deb.debian.org/debian $suite main" >"$work/sources.list"
  apt_opts=(
    -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1
    -o APT::Sandbox::User=root -qq
  )
  apt-get "${apt_opts[@]}" update >&2 || fail "apt-get update of $suite failed"
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download "mesa-vulkan-drivers/$suite" "libdrm2/$suite" >&2) ||
    fail "apt-get download of mesa-vulkan-drivers/$suite failed"
  for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  lib="$(find "$work/root" -name libvulkan_lvp.so | head -1)"
  [ -n "$lib" ] || fail "no libvulkan_lvp.so in mesa-vulkan-drivers/$suite"
  rm -rf "$work/cache" "$work/lists" "$work/debs" "$dir" && mv "$work" "$dir"
  lib="$dir${lib#"$work"}"
  printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$lib" >"$icd"
fi

lib="$(sed -n 's/.*"library_path":"\([^"]*\)".*/\1/p' "$icd")"
[ -f "$lib" ] || fail "$icd names $lib, which is missing (delete $dir and rerun)"
missing="$(LD_LIBRARY_PATH="$(dirname "$lib")" ldd "$lib" | sed -n 's/^\s*\(\S*\) => not found/\1/p' | tr '\n' ' ')"
[ -z "$missing" ] || fail "libvulkan_lvp.so needs ${missing}(apt-get install mesa-vulkan-drivers provides them)"
echo "$icd"
