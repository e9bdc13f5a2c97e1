import { defineConfig } from '@playwright/test';

// Debian's Chromium with SwiftShader gives headless WebGPU without a GPU (see README, Testing).
const executablePath = process.env.CHROME_PATH ?? '/usr/bin/chromium';
const PORT = 5179;

export default defineConfig({
  testDir: 'e2e',
  timeout: 300_000,
  expect: { timeout: 120_000 },
  workers: 1,
  reporter: [['list']],
  outputDir: 'test-results',
  use: {
    baseURL: `http://127.0.0.1:${PORT}`,
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
  webServer: {
    command: `node_modules/.bin/vite --port ${PORT} --strictPort --host 127.0.0.1`,
    url: `http://127.0.0.1:${PORT}`,
    reuseExistingServer: false,
    timeout: 120_000,
  },
});
