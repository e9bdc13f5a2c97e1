// The process environment a Node GPU run needs on a headless box, set before anything loads the
// npm `webgpu` module (import this first): the `spyrl` CLI and `npm run bench` share it.
import { existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { isAbsolute, join } from 'node:path';

// Without a valid XDG_RUNTIME_DIR (a headless box, a container, sudo) the graphics stack prints
// "error: XDG_RUNTIME_DIR is invalid or not set in the environment." twice when the GPU starts.
// A private folder (mkdtemp: mode 0700) of our own silences it; it goes when the process does.
const runtimeDir = process.env.XDG_RUNTIME_DIR;
if (!runtimeDir || !isAbsolute(runtimeDir) || !statSync(runtimeDir, { throwIfNoEntry: false })?.isDirectory()) {
  const dir = mkdtempSync(join(tmpdir(), 'spyrl-runtime-'));
  process.env.XDG_RUNTIME_DIR = dir;
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
}

// Without a real GPU driver Dawn needs a Vulkan ICD; fall back to Chromium's SwiftShader when present.
const swiftshader = '/usr/lib/chromium/vk_swiftshader_icd.json';
if (
  !process.env.VK_ICD_FILENAMES &&
  process.env.SPYRL_SWIFTSHADER !== '0' &&
  !existsSync('/dev/nvidia0') &&
  !existsSync('/dev/dri') &&
  existsSync(swiftshader)
) {
  process.env.VK_ICD_FILENAMES = swiftshader;
}
