// The Content-Security-Policy of the built app, as a <meta> tag (GitHub Pages cannot send
// headers). The app talks only to itself and the Hugging Face Hub; its worker is a same-origin
// module; nothing is evaluated from strings. Injected at build time only (vite.config.ts): the
// dev server inserts CSS as <style> elements and talks HMR over a websocket.
import type { Plugin } from 'vite';

/** The Hub's API and file hosts: huggingface.co resolves, then redirects to an LFS or Xet CDN. */
export const HUB_ORIGINS = [
  'https://huggingface.co',
  'https://cdn-lfs.huggingface.co',
  'https://cdn-lfs-us-1.huggingface.co',
  'https://cdn-lfs.hf.co',
  'https://cdn-lfs-us-1.hf.co',
  'https://cas-bridge.xethub.hf.co',
  'https://*.hf.co',
];

function policy(directives: Record<string, string[]>): string {
  return Object.entries(directives)
    .map(([k, v]) => `${k} ${v.join(' ')}`)
    .join('; ');
}

const common = {
  'default-src': ["'self'"],
  'connect-src': ["'self'", ...HUB_ORIGINS, 'blob:', 'data:'],
  'img-src': ["'self'", 'data:', 'blob:'],
  'font-src': ["'self'", 'data:'],
  'worker-src': ["'self'", 'blob:'],
  'object-src': ["'none'"],
  'base-uri': ["'self'"],
  'form-action': ["'none'"],
};

/** The app (index.html): no WebAssembly, no eval; React sets styles through the DOM, charts may add style attributes. */
export const APP_CSP = policy({ ...common, 'script-src': ["'self'"], 'style-src': ["'self'", "'unsafe-inline'"] });

/**
 * The benchmark page (bench.html): onnxruntime-web compiles its WebAssembly, which needs
 * 'wasm-unsafe-eval' (not 'unsafe-eval': no JavaScript from strings); the page has an inline <style>.
 */
export const BENCH_CSP = policy({
  ...common,
  'script-src': ["'self'", "'wasm-unsafe-eval'"],
  'style-src': ["'self'", "'unsafe-inline'"],
});

/** Inserts the policy right after <meta charset> (else at the top of <head>): before every script and link, so it covers them all. */
export function injectCsp(html: string, csp: string): string {
  if (/http-equiv=["']Content-Security-Policy["']/i.test(html))
    throw new Error('the page already has a Content-Security-Policy meta tag');
  const tag = `<meta http-equiv="Content-Security-Policy" content="${csp.replaceAll('"', '&quot;')}" />`;
  const anchor = /<meta charset[^>]*>/i.exec(html) ?? /<head[^>]*>/i.exec(html);
  if (!anchor) throw new Error('the page has no <head> to put the Content-Security-Policy in');
  const end = anchor.index + anchor[0].length;
  if (/<script|<link/i.test(html.slice(0, anchor.index)))
    throw new Error('a script or link comes before the Content-Security-Policy would');
  return `${html.slice(0, end)}\n    ${tag}${html.slice(end)}`;
}

export function cspForPage(filename: string): string {
  return /(^|[\\/])bench\.html$/.test(filename) ? BENCH_CSP : APP_CSP;
}

/** Vite plugin: the CSP meta tag in every built page (build only). */
export function cspPlugin(): Plugin {
  return {
    name: 'spyrl-csp',
    apply: 'build',
    transformIndexHtml: {
      order: 'post',
      handler: (html, ctx) => injectCsp(html, cspForPage(ctx.filename)),
    },
  };
}
