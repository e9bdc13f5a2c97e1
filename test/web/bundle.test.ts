// The production bundle (vite.config.ts): split so that no JS chunk passes Vite's 500 kB warning,
// with recharts (the charts) and the evaluation view out of the app's entry, and onnxruntime-web
// only on the benchmark page; and the site's base path (SPYRL_BASE) checked.
import { build, type Rollup } from 'vite';
import { describe, expect, it } from 'vitest';
import { basePath } from '../../vite.config.ts';

const LIMIT = 500 * 1024; // Vite's chunkSizeWarningLimit (500 kB)

async function buildChunks(): Promise<Rollup.OutputChunk[]> {
  // Vitest sets NODE_ENV=test, which Vite would bake in (React's development build): build as `npm run build` does.
  const nodeEnv = process.env.NODE_ENV;
  process.env.NODE_ENV = 'production';
  let out;
  try {
    out = await build({
      configFile: 'vite.config.ts',
      mode: 'production',
      logLevel: 'silent',
      build: { write: false },
    });
  } finally {
    process.env.NODE_ENV = nodeEnv;
  }
  const outputs = (Array.isArray(out) ? out : [out]) as Rollup.RollupOutput[];
  return outputs.flatMap((o) => o.output.filter((c): c is Rollup.OutputChunk => c.type === 'chunk'));
}

describe('production bundle', () => {
  it('has no chunk over 500 kB; the app entry has neither recharts, the eval view nor onnxruntime-web', async () => {
    const chunks = await buildChunks();
    const sizes = chunks.map((c) => [c.fileName, Buffer.byteLength(c.code)] as const);
    expect(sizes.filter(([, n]) => n > LIMIT)).toEqual([]);
    const entry = chunks.find((c) => c.isEntry && c.moduleIds.some((m) => m.endsWith('/src/web/main.tsx')));
    expect(entry, 'the app entry chunk').toBeDefined();
    // The entry and the chunks it imports statically: what the page loads before anything is needed.
    const byName = new Map(chunks.map((c) => [c.fileName, c]));
    const eager = new Set<string>();
    const visit = (name: string) => {
      if (eager.has(name)) return;
      eager.add(name);
      for (const i of byName.get(name)?.imports ?? []) visit(i);
    };
    visit(entry!.fileName);
    const eagerModules = [...eager].flatMap((n) => byName.get(n)?.moduleIds ?? []);
    expect(eagerModules.some((m) => m.includes('/src/web/main.tsx'))).toBe(true);
    expect(eagerModules.filter((m) => /node_modules\/(recharts|onnxruntime-web)\//.test(m))).toEqual([]);
    expect(eagerModules.filter((m) => /src\/ui\/(EvalView|ChartPlot)\.tsx$/.test(m))).toEqual([]);
    // ...and they are chunks of their own, fetched by dynamic import.
    expect(entry!.dynamicImports.length).toBeGreaterThanOrEqual(2);
    const lazy = chunks.filter((c) => !eager.has(c.fileName)).flatMap((c) => c.moduleIds);
    expect(lazy.some((m) => m.endsWith('/src/ui/EvalView.tsx'))).toBe(true);
    expect(lazy.some((m) => m.includes('node_modules/recharts/'))).toBe(true);
  }, 120_000);
});

describe('basePath (SPYRL_BASE)', () => {
  it('is / by default and always ends with a slash', () => {
    expect(basePath(undefined)).toBe('/');
    expect(basePath('')).toBe('/');
    expect(basePath('/spyrl')).toBe('/spyrl/');
    expect(basePath('/spyrl/')).toBe('/spyrl/');
  });

  it('refuses a relative or protocol-relative base, naming SPYRL_BASE', () => {
    for (const bad of ['./', 'spyrl/', '//cdn.example/'])
      expect(() => basePath(bad)).toThrow(/SPYRL_BASE must be an absolute path/);
  });
});
