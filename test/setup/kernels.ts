// Vitest setup: SPYRL_KERNELS (`name=value,...`, the CLI's --kernels text) sets the kernel variant
// switches every test file starts from. npm test runs the model-level golden tests once more with
// SPYRL_KERNELS=autoFor=gpu (scripts/test.mjs), so the variants 'auto' picks on a real GPU are
// checked against PyTorch on SwiftShader and lavapipe too. Unset: the defaults.
import { resetTuning, parseTuning } from '../../src/ops/common.ts';

const spec = process.env.SPYRL_KERNELS;
if (spec) {
  try {
    resetTuning(parseTuning(spec));
  } catch (e) {
    throw new Error(`SPYRL_KERNELS: ${(e as Error).message}`, { cause: e });
  }
}
