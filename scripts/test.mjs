#!/usr/bin/env node
// `npm test`: lint (style and layer rules), type-check, the outside oracles, unit tests (Node +
// Dawn over SwiftShader), the golden model tests again with a GPU's 'auto' kernel choices, the
// kernel tests over Mesa's lavapipe (three feature sets, shader-f16 among them), then the
// end-to-end tests in a real headless Chromium. Finds a Chromium first; on Debian as root it installs
// Debian's `chromium` (which also ships the SwiftShader Vulkan driver the Node kernel tests use)
// when none is found; elsewhere it stops and says what to install.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname } from 'node:path';

const candidates = [
  process.env.CHROME_PATH,
  '/usr/bin/chromium',
  '/usr/bin/chromium-browser',
  '/usr/bin/google-chrome',
  '/usr/bin/google-chrome-stable',
].filter(Boolean);
const SWIFTSHADER_ICD = '/usr/lib/chromium/vk_swiftshader_icd.json';

function findChrome() {
  return candidates.find((p) => existsSync(p));
}

function isDebianRoot() {
  return process.getuid?.() === 0 && existsSync('/etc/debian_version') && existsSync('/usr/bin/apt-get');
}

let chrome = findChrome();
const hasVulkanLoader = [
  '/usr/lib/x86_64-linux-gnu/libvulkan.so.1',
  '/usr/lib/aarch64-linux-gnu/libvulkan.so.1',
  '/usr/lib/libvulkan.so.1',
].some((p) => existsSync(p));
if (!chrome || !existsSync(SWIFTSHADER_ICD) || !hasVulkanLoader) {
  if (isDebianRoot()) {
    console.log('npm test: installing Debian chromium (browser for e2e, SwiftShader for WebGPU tests) with apt-get');
    execFileSync('apt-get', ['update', '-qq'], { stdio: 'inherit' });
    execFileSync('apt-get', ['install', '-y', '-qq', 'chromium', 'libvulkan1'], {
      stdio: 'inherit',
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
    });
    chrome = findChrome();
  }
  if (!chrome) {
    console.error(
      'npm test: no Chromium or Chrome found. Install one (Debian/Ubuntu: `apt-get install chromium`) or set CHROME_PATH to its executable.',
    );
    process.exit(1);
  }
}

const env = { ...process.env, CHROME_PATH: chrome };
// Without a real GPU, Dawn in Node needs a Vulkan driver: use Chromium's SwiftShader when no other is forced.
if (!env.VK_ICD_FILENAMES && existsSync(SWIFTSHADER_ICD)) env.VK_ICD_FILENAMES = SWIFTSHADER_ICD;

// Each stage's wall time, printed as it ends and summed at the end: CI has 90 minutes on 2 cores,
// and its log is where a stage that grew shows first.
const started = Date.now();
const stageTimes = [];
const seconds = (ms) => `${Math.round(ms / 1000)} s`;

function run(label, cmd, args) {
  console.log(`\n== ${label}: ${cmd} ${args.join(' ')}`);
  const t0 = Date.now();
  const r = spawnSync(cmd, args, { stdio: 'inherit', env });
  const took = Date.now() - t0;
  stageTimes.push([label, took]);
  console.log(`== ${label}: ${r.status === 0 ? 'passed' : 'failed'} in ${seconds(took)}`);
  if (r.status !== 0) {
    console.error(`npm test: ${label} failed (exit ${r.status ?? r.signal})`);
    process.exit(r.status || 1);
  }
}

const bin = (name) => `node_modules/.bin/${name}`;

// The kernel tests on Mesa's lavapipe (scripts/lavapipe.sh), a second software GPU, and one with
// shader-f16, so the f16 variants run (SPYRL_REQUIRE_F16 turns their skip into a failure). It
// compiles and runs our kernels about 20x faster than SwiftShader (test/ops: matmulGroup 7.6 s
// against 197 s, with Mesa's shader cache warm), so where it is available the kernel tests
// (KERNEL_TESTS) run on it alone, in three feature sets:
// - without shader-f16 (SPYRL_GPU_FEATURES_OFF, src/gpu/device.ts), lavapipe's own subgroups (8
//   lanes on AVX2): the fallbacks SwiftShader, which has no shader-f16, takes. SwiftShader's own
//   4-lane subgroups stay covered by the model tests on SwiftShader (golden, LoRA golden and q4
//   golden with a GPU's choices run the lane GEMVs, the folded norm and the fused groups against
//   PyTorch); lavapipe at 4 lanes (LP_NATIVE_VECTOR_WIDTH=128) compiled them so slowly with a
//   cold shader cache (886 s, fusedDecode past its timeouts) that it is not a CI stage;
// - with shader-f16 and the same 8 lanes;
// - with shader-f16 and 16-lane subgroups (LP_NATIVE_VECTOR_WIDTH=512), the width of many GPUs'
//   subgroups and the one the subgroup GEMM needs. (1024 makes lavapipe report 32 while its
//   subgroup operations still span 16 lanes, so 16 is the widest it runs honestly;
//   test/gpu/gpu.test.ts probes that.)
// Where lavapipe cannot be fetched the kernel tests run on SwiftShader in the unit stage instead,
// with a note, unless SPYRL_REQUIRE_LAVAPIPE is set (CI), where that fails.
const KERNEL_TESTS = ['test/ops', 'test/model/fusedDecode.test.ts'];
const LAVAPIPE_TESTS = [
  'test/ops',
  'test/gpu',
  'test/model/golden.test.ts',
  'test/train/policy.test.ts',
  'test/cli/kernels.test.ts',
  'test/worker/engine.test.ts',
];
// The golden model tests (logits, greedy and batched decode, LoRA loss and gradients, q4) once
// more with the variants 'auto' picks on a real GPU (SPYRL_KERNELS=autoFor=gpu, read by
// test/setup/kernels.ts): the tiled and f16 GEMMs, the lane GEMVs with the folded RMSNorm, the
// split decode attention, against PyTorch here too. On lavapipe (shader-f16) the f16 GEMM runs
// under its own budgets (test/helpers/gemmBudget.ts), and the trainer's consistency tests
// (sampling vs training log-probs, packed vs alone, decode-ahead, shared KV prefixes) run with the
// GPU's choices but f32 tiles (gemmF16=off): their f32 budgets are what they check, and the f16
// GEMM's effect on them is policy.test.ts's own measurement. q4Golden's and kvCache's CLI checks
// read stderr, which lavapipe's warnings fill, so those run on SwiftShader only (q4Golden) or not
// at all with these choices (kvCache); SwiftShader is too slow for the trainer's set (minutes each).
const GPU_CHOICE_TESTS = ['test/model/golden.test.ts', 'test/model/loraGolden.test.ts'];
const GPU_CHOICE_TRAINER_TESTS = [
  'test/train/policy.test.ts',
  'test/train/packing.test.ts',
  'test/train/policyAhead.test.ts',
  'test/train/kvShare.test.ts',
  'test/train/trainerPaths.test.ts',
];
function gpuChoices(label, tests, kernels = 'autoFor=gpu', what = "with a GPU's 'auto' kernel choices", extra = []) {
  env.SPYRL_KERNELS = kernels;
  run(`${label} ${what} (${kernels})`, bin('vitest'), ['run', ...extra, ...tests]);
  delete env.SPYRL_KERNELS;
}

/** The lavapipe driver: its ICD file and library (scripts/lavapipe.sh), or null where it cannot be had. */
function lavapipeDriver() {
  const r = spawnSync('bash', ['scripts/lavapipe.sh'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  const icd = r.stdout?.trim();
  if (r.status !== 0 || !icd) {
    if (process.env.SPYRL_REQUIRE_LAVAPIPE) {
      console.error(`npm test: lavapipe: scripts/lavapipe.sh failed (exit ${r.status ?? r.signal})`);
      process.exit(1);
    }
    console.log(
      '\nnpm test: lavapipe could not be had (see above): the kernel tests run on SwiftShader, and the shader-f16 stage is skipped',
    );
    return null;
  }
  return { icd, lib: JSON.parse(readFileSync(icd, 'utf8')).ICD.library_path };
}

// Per-test time limits on lavapipe: 10 minutes, not vitest.config.ts's 2. Lavapipe compiles a
// kernel variant with LLVM once and keeps it in Mesa's shader cache (~/.cache/mesa_shader_cache);
// with that cache cold (a changed kernel, a new machine) one test of the decode GEMVs with the
// folded RMSNorm took 48-173 s at 16 lanes, mostly compiling (test/ops/normFold.test.ts,
// 2026-12-07, at e779bd0 as after it), past 120 s. Warm, its whole file takes 6 s.
const LAVAPIPE_TIMEOUTS = ['--testTimeout', '600000', '--hookTimeout', '600000'];

function lavapipeStage({ icd, lib }) {
  const label = 'kernel tests on Mesa lavapipe';
  const keys = [
    'LD_LIBRARY_PATH',
    'VK_ICD_FILENAMES',
    'SPYRL_REQUIRE_F16',
    'SPYRL_GPU_FEATURES_OFF',
    'LP_NATIVE_VECTOR_WIDTH',
    'SPYRL_EXPECT_SUBGROUP_SIZE',
  ];
  const saved = Object.fromEntries(keys.map((k) => [k, env[k]]));
  // The driver's own libdrm (backports) ahead of the system's.
  env.LD_LIBRARY_PATH = [dirname(lib), env.LD_LIBRARY_PATH].filter(Boolean).join(':');
  env.VK_ICD_FILENAMES = icd;
  env.SPYRL_GPU_FEATURES_OFF = 'shader-f16';
  run(`${label}, without shader-f16 (SwiftShader's fallbacks), its own subgroup width`, bin('vitest'), [
    'run',
    ...LAVAPIPE_TIMEOUTS,
    ...KERNEL_TESTS,
    'test/gpu',
  ]);
  delete env.SPYRL_GPU_FEATURES_OFF;
  env.SPYRL_REQUIRE_F16 = '1';
  run(`${label} (shader-f16), its own subgroup width`, bin('vitest'), ['run', ...LAVAPIPE_TIMEOUTS, ...LAVAPIPE_TESTS]);
  gpuChoices(
    `golden tests on lavapipe, its own subgroup width,`,
    GPU_CHOICE_TESTS,
    undefined,
    undefined,
    LAVAPIPE_TIMEOUTS,
  );
  env.LP_NATIVE_VECTOR_WIDTH = '512';
  env.SPYRL_EXPECT_SUBGROUP_SIZE = '16'; // test/gpu/gpu.test.ts: the probe must see 16-lane subgroups
  run(`${label} (shader-f16), subgroups of 16`, bin('vitest'), ['run', ...LAVAPIPE_TIMEOUTS, ...LAVAPIPE_TESTS]);
  gpuChoices(`golden tests on lavapipe, subgroups of 16,`, GPU_CHOICE_TESTS, undefined, undefined, LAVAPIPE_TIMEOUTS);
  gpuChoices(
    `trainer tests on lavapipe, subgroups of 16,`,
    GPU_CHOICE_TRAINER_TESTS,
    'autoFor=gpu,gemmF16=off',
    undefined,
    LAVAPIPE_TIMEOUTS,
  );
  for (const k of keys) {
    if (saved[k] === undefined) delete env[k];
    else env[k] = saved[k];
  }
}
run('lint (ESLint with the layer rules, Prettier)', 'npm', ['run', '--silent', 'lint']);
run('type-check', bin('tsc'), ['--noEmit', '-p', '.']);
run('outside oracles (golden fixtures vs Hugging Face transformers and PEFT)', 'node', ['scripts/oracles.mjs']);
const lavapipe = lavapipeDriver();
// Every test file on SwiftShader, but for the kernel tests where lavapipe runs them (below).
run(lavapipe ? 'unit tests (the kernel tests run on lavapipe below)' : 'unit and kernel tests', bin('vitest'), [
  'run',
  ...(lavapipe ? KERNEL_TESTS.flatMap((t) => ['--exclude', t.endsWith('.ts') ? t : `${t}/**`]) : []),
]);
// trainingMemory: the training pass's memory formula, exact against the live bytes, with the GPU's
// split-K scratch (src/ops/splitK.ts) that only GPU choices allocate.
gpuChoices('golden and memory-plan tests', [
  ...GPU_CHOICE_TESTS,
  'test/model/q4Golden.test.ts',
  'test/train/trainingMemory.test.ts',
]);
// The register-tiled attention (tuning.attentionForward / attentionBackward 'blocks', which 'auto'
// takes on GPUs from 128 tokens, past these fixtures' lengths; forced here, tiled from 9 tokens)
// against Hugging Face and PyTorch autograd: the untied-sharded fixture's
// head_dim 32 takes them (a multiple of 32) in its prefill over the paged cache (logits, greedy
// and batched decode) and, as untied-rslora's base, in the LoRA forward and gradients.
gpuChoices(
  'golden tests',
  ['test/model/golden.test.ts', 'test/model/loraGolden.test.ts'],
  'attention=tiled,attentionForward=blocks,attentionBackward=blocks',
  'with the register-tiled attention forced',
);
if (lavapipe) lavapipeStage(lavapipe);
run('demo model', 'node', ['scripts/demo-model.mjs']);
// End to end: every spec on the dev server, then the app spec (a round, the axe checks) and the
// sub-path spec on the production bundle, built fresh and served by `vite preview` under /spyrl/.
delete env.E2E_TARGET;
run('end-to-end tests (dev server)', bin('playwright'), ['test']);
env.E2E_TARGET = 'preview';
run('end-to-end tests (production build, from a sub-path)', bin('playwright'), [
  'test',
  'e2e/app.spec.ts',
  'e2e/subpath.spec.ts',
]);
console.log('\nnpm test: stage times');
for (const [label, ms] of stageTimes) console.log(`${seconds(ms).padStart(7)}  ${label}`);
console.log(`npm test: all passed in ${seconds(Date.now() - started)}`);
