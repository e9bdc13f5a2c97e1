#!/usr/bin/env node
// The `spyrl` command: TypeScript sources run through tsx, so the CLI and the app share one engine.
import { register } from 'tsx/esm/api';
import { existsSync } from 'node:fs';

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
register();
const { main } = await import('../src/cli/main.ts');
process.exitCode = await main(process.argv.slice(2));
