import { defineConfig } from '@playwright/test';

// Debian's Chromium with SwiftShader gives headless WebGPU without a GPU (see README, Testing).
const executablePath = process.env.CHROME_PATH ?? '/usr/bin/chromium';

// E2E_TARGET=preview runs the suite against the production bundle: a fresh `npm run build`,
// served by `vite preview` from a sub-path, as GitHub Pages serves a project site
// (https://user.github.io/spyrl/). Specs open './', which resolves against baseURL. The default
// is the dev server at the root. The two use different ports, so they never take each other's.
const preview = process.env.E2E_TARGET === 'preview';
if (process.env.E2E_TARGET && !preview)
  throw new Error(`E2E_TARGET must be "preview" or unset (got "${process.env.E2E_TARGET}")`);
const PORT = preview ? 5181 : 5179;
/** The sub-path of the preview build; e2e/subpath.spec.ts checks that everything stays under it. */
export const PREVIEW_BASE = '/spyrl/';
const origin = `http://127.0.0.1:${PORT}`;
const baseURL = preview ? `${origin}${PREVIEW_BASE}` : `${origin}/`;

export default defineConfig({
  testDir: 'e2e',
  timeout: 300_000,
  expect: { timeout: 120_000 },
  workers: 1,
  reporter: [['list']],
  outputDir: preview ? 'test-results/preview' : 'test-results',
  use: {
    baseURL,
    screenshot: 'only-on-failure',
    launchOptions: {
      executablePath,
      args: [
        '--enable-unsafe-webgpu',
        '--enable-unsafe-swiftshader',
        '--use-angle=swiftshader',
        '--no-sandbox',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run',
      ],
    },
  },
  webServer: preview
    ? {
        // The same scripts a user runs; SPYRL_BASE (vite.config.ts) is read by both the build and the preview.
        command: `npm run build && npm run preview -- --port ${PORT} --strictPort --host 127.0.0.1`,
        env: { SPYRL_BASE: PREVIEW_BASE },
        url: baseURL,
        reuseExistingServer: false,
        timeout: 180_000,
      }
    : {
        command: `node_modules/.bin/vite --port ${PORT} --strictPort --host 127.0.0.1`,
        url: baseURL,
        reuseExistingServer: false,
        timeout: 120_000,
      },
});
