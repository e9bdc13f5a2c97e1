import { defineConfig } from 'vite';

export default defineConfig({
  server: { fs: { allow: ['.'] } },
  worker: { format: 'es' },
  build: { target: 'es2022' },
  // The Node-only GPU backend is never bundled: the browser uses navigator.gpu.
  optimizeDeps: { exclude: ['webgpu'] },
});
