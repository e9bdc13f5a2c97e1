// Issue 9: the built app carries a Content-Security-Policy meta tag: self, the Hub and its CDNs,
// blob/worker sources; 'wasm-unsafe-eval' only on the benchmark page (onnxruntime-web).
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { APP_CSP, BENCH_CSP, cspPlugin, injectCsp } from '../../src/web/csp.ts';
import viteConfig from '../../vite.config.ts';

function directives(csp: string): Map<string, string[]> {
  return new Map(
    csp
      .split(';')
      .map((d) => d.trim().split(/\s+/))
      .map(([k, ...v]) => [k!, v]),
  );
}

/** What Vite's build does with a page: the plugin's transformIndexHtml handler. */
function transform(html: string, filename: string): string {
  const hook = cspPlugin().transformIndexHtml as {
    order: string;
    handler: (html: string, ctx: { filename: string; path: string }) => string;
  };
  expect(hook.order).toBe('post');
  return hook.handler(html, { filename, path: `/${filename}` });
}

function metaCsp(html: string): string {
  const m = /<meta http-equiv="Content-Security-Policy" content="([^"]*)" \/>/.exec(html);
  expect(m, 'CSP meta tag').not.toBeNull();
  return m![1]!.replaceAll('&quot;', '"');
}

describe('Content-Security-Policy of the built pages', () => {
  it('index.html gets the app policy before any script; bench.html the benchmark one', () => {
    const index = transform(readFileSync('index.html', 'utf8'), '/work/x/index.html');
    expect(metaCsp(index)).toBe(APP_CSP);
    expect(index.indexOf('Content-Security-Policy')).toBeLessThan(index.indexOf('<script'));
    expect(index.indexOf('<meta charset')).toBeLessThan(index.indexOf('Content-Security-Policy')); // charset stays first
    const bench = transform(
      '<!doctype html><html><head><meta charset="UTF-8" /><style>b{}</style></head><body><script type="module" src="/bench/browser.ts"></script></body></html>',
      '/work/x/bench.html',
    );
    expect(metaCsp(bench)).toBe(BENCH_CSP);
    expect(() => injectCsp(index, APP_CSP)).toThrow(/already has/);
  });

  it('allows only self, the Hub and its CDNs, and blob/worker sources; no eval', () => {
    const app = directives(APP_CSP);
    expect(app.get('default-src')).toEqual(["'self'"]);
    expect(app.get('script-src')).toEqual(["'self'"]); // the app has no WebAssembly and no inline script
    expect(app.get('worker-src')).toEqual(["'self'", 'blob:']);
    expect(app.get('object-src')).toEqual(["'none'"]);
    const hosts = app.get('connect-src')!.filter((s) => s.startsWith('https://'));
    for (const h of [
      'https://huggingface.co',
      'https://cdn-lfs.huggingface.co',
      'https://cdn-lfs-us-1.hf.co',
      'https://cas-bridge.xethub.hf.co',
    ])
      expect(hosts).toContain(h);
    for (const h of hosts) expect(h).toMatch(/^https:\/\/([\w*-]+\.)*(huggingface\.co|hf\.co)$/);
    expect(APP_CSP).not.toMatch(/unsafe-eval|\*(?!\.)/); // no 'unsafe-eval', 'wasm-unsafe-eval' or bare wildcard
    expect(directives(BENCH_CSP).get('script-src')).toEqual(["'self'", "'wasm-unsafe-eval'"]); // onnxruntime-web compiles WebAssembly
  });

  it('is a build-only plugin in vite.config.ts (the dev server keeps HMR and its <style> inserts)', () => {
    const plugin = cspPlugin();
    expect(plugin.apply).toBe('build');
    const plugins = ((viteConfig as { plugins?: { name: string }[] }).plugins ?? []).flat();
    expect(plugins.map((p) => p.name)).toContain('spyrl-csp');
  });
});
