import { availableParallelism } from 'node:os';
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    pool: 'forks',
    // Two test files at a time even on 2 cores (vitest's default there is 1): a file spends most
    // of its time on one core (SwiftShader's shader compiles and dispatches, the CPU references),
    // so two at once nearly halve the suite's wall time (measured: 4 files, 146 s one at a time,
    // 81 s two at a time).
    maxWorkers: Math.max(2, availableParallelism() - 1),
    setupFiles: ['test/setup/kernels.ts'],
    env: { VK_ICD_FILENAMES: process.env.VK_ICD_FILENAMES ?? '/usr/lib/chromium/vk_swiftshader_icd.json' },
  },
});
