// Vitest setup: SPYRL_KERNELS (`name=value,...`, the CLI's --kernels text) sets the kernel variant
// switches every test file starts from. npm test runs the golden model tests and the trainer's
// consistency tests once more with a GPU's 'auto' choices (SPYRL_KERNELS=autoFor=gpu...,
// scripts/test.mjs), so the variants a real GPU gets are checked on SwiftShader and lavapipe too.
// A file that leaves other settings behind (a resetTuning, a switch set back to 'auto' instead of
// to what it was) would have run some of its tests with the wrong kernels: that fails the file.
// Unset: the defaults, and no check.
import { afterAll, expect } from 'vitest';
import { parseTuning, resetTuning, tuning } from '../../src/ops/common.ts';

const spec = process.env.SPYRL_KERNELS;
if (spec) {
  let settings;
  try {
    settings = parseTuning(spec);
  } catch (e) {
    throw new Error(`SPYRL_KERNELS: ${(e as Error).message}`, { cause: e });
  }
  resetTuning(settings);
  afterAll(() => {
    expect({ ...tuning }, `the kernel settings after this file (SPYRL_KERNELS=${spec})`).toMatchObject(settings);
  });
}
