import { defineConfig } from 'vite';
import { cspPlugin } from './src/web/csp.ts';

export default defineConfig({
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
