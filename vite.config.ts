import { defineConfig } from 'vite';
import { cspPlugin } from './src/web/csp.ts';

/**
 * The path the site is served under: '/' by default, `SPYRL_BASE=/spyrl/` for a project page
 * such as https://user.github.io/spyrl/ (.github/workflows/pages.yml sets it). It must be an
 * absolute path, not './': the engine worker finds the bundled tiny model at
 * `${import.meta.env.BASE_URL}tiny-demo/` against its own URL (src/worker/engine.ts), and a
 * relative base would resolve that under assets/.
 */
export function basePath(raw: string | undefined): string {
  const base = raw?.trim() || '/';
  if (!base.startsWith('/') || base.startsWith('//'))
    throw new Error(
      `SPYRL_BASE must be an absolute path such as /spyrl/ (got "${raw}"): the worker resolves the bundled model against it`,
    );
  return base.endsWith('/') ? base : `${base}/`;
}

export default defineConfig({
  base: basePath(process.env.SPYRL_BASE),
  plugins: [cspPlugin()], // Content-Security-Policy meta tag in the built pages (src/web/csp.ts)
  server: { fs: { allow: ['.'] } },
  worker: { format: 'es' },
  build: {
    target: 'es2022',
    // Two pages: the app, and bench.html (the benchmark suite, bench/browser.ts).
    rolldownOptions: { input: { main: 'index.html', bench: 'bench.html' } },
  },
  // The Node-only GPU backend is never bundled: the browser uses navigator.gpu.
  optimizeDeps: { exclude: ['webgpu'] },
});
