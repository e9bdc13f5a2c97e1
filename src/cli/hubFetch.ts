// How the CLI talks to the Hub: HF_ENDPOINT in place of huggingface.co, the token sent to that
// host only (redirects followed here, so a CDN never sees it), the blob name (ETag) of every
// download noted for the cache, and download progress on stderr.
import type { DownloadProgress } from '../model/sources.ts';
import { normalizeEtag } from './hfCache.ts';

const HUB = 'https://huggingface.co';
const REDIRECTS = new Set([301, 302, 303, 307, 308]);

export interface HubFetchOptions {
  /** HF_ENDPOINT (default https://huggingface.co). */
  endpoint?: string;
  token?: string;
  /** HF_HUB_OFFLINE: every request fails without touching the network. */
  offline?: boolean;
  fetch?: typeof fetch;
}

export interface HubFetch {
  fetch: typeof fetch;
  /** The Hub's ETag for a download, by the shared loader's cache key `{repo}/{sha}/{file}`. */
  etagFor(key: string): string | null;
}

/** `/{owner}/{name}/resolve/{sha}/{file}` -> `{owner}/{name}/{sha}/{file}`, else null. */
function resolveKey(url: URL): string | null {
  const m = /^\/([^/]+)\/([^/]+)\/resolve\/([0-9a-f]{40})\/(.+)$/.exec(url.pathname);
  if (!m) return null;
  try {
    return `${m[1]}/${m[2]}/${m[3]}/${m[4]!.split('/').map(decodeURIComponent).join('/')}`;
  } catch {
    return null;
  }
}

export function hubFetch(opts: HubFetchOptions = {}): HubFetch {
  const endpoint = (opts.endpoint || HUB).replace(/\/+$/, '');
  const origin = new URL(endpoint).origin;
  const base = opts.fetch ?? ((input, init) => fetch(input, init));
  const etags = new Map<string, string>();

  const doFetch: typeof fetch = async (input, init) => {
    let url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
    if (opts.offline) throw new Error(`HF_HUB_OFFLINE is set, so ${url} was not requested`);
    if (url.startsWith(HUB)) url = endpoint + url.slice(HUB.length);
    const key = resolveKey(new URL(url));
    for (let hop = 0; ; hop++) {
      const onHub = new URL(url).origin === origin;
      const headers = new Headers(init?.headers);
      // Only the Hub's own host gets the token: never a CDN it redirects to.
      if (opts.token && onHub) headers.set('authorization', `Bearer ${opts.token}`);
      else headers.delete('authorization');
      const res = await base(url, { ...init, headers, redirect: 'manual' });
      const redirect = REDIRECTS.has(res.status) ? res.headers.get('location') : null;
      const next = redirect ? new URL(redirect, url) : null;
      if (key && onHub && next?.origin !== origin && !etags.has(key)) {
        // As huggingface_hub names blobs: from the Hub's last answer before it sends us elsewhere
        // (an LFS file: X-Linked-Etag, its sha256), else its ETag (the git blob id). Never the CDN's.
        const etag = normalizeEtag(res.headers.get('x-linked-etag') ?? res.headers.get('etag'));
        if (etag) etags.set(key, etag);
      }
      if (!next) return res;
      await res.body?.cancel().catch(() => undefined);
      if (hop >= 10) throw new Error(`more than 10 redirects from ${url}`);
      url = next.href;
    }
  };
  return { fetch: doFetch, etagFor: (key) => etags.get(key) ?? null };
}

/** 950 B, 12.3 kB, 45.6 MB, 7.80 GB. */
export function formatBytes(n: number): string {
  if (n < 1e3) return `${n} B`;
  if (n < 1e6) return `${(n / 1e3).toFixed(1)} kB`;
  if (n < 1e9) return `${(n / 1e6).toFixed(1)} MB`;
  return `${(n / 1e9).toFixed(2)} GB`;
}

/**
 * Download progress, one file at a time: on a terminal one line updated in place (ended when the
 * file is done); else (a log, a pipe) a line every `everyMs` while a file downloads, and one when it is done.
 */
export function progressPrinter(
  out: NodeJS.WritableStream & { isTTY?: boolean },
  label: string,
  opts: { everyMs?: number } = {},
): (p: DownloadProgress) => void {
  const every = opts.everyMs ?? 5000;
  const started = new Map<string, number>();
  const finished = new Set<string>();
  let lastLine = performance.now();
  return (p) => {
    const now = performance.now();
    const first = !started.has(p.file);
    if (first) started.set(p.file, now);
    const done = !first && (p.total > 0 ? p.loaded >= p.total : p.loaded === 0);
    // The loader may report the last chunk and then the finished file: one line for both.
    if (finished.has(p.file)) return;
    if (done) finished.add(p.file);
    const size =
      p.total > 0
        ? `${formatBytes(p.loaded)} of ${formatBytes(p.total)} (${Math.floor((100 * p.loaded) / p.total)}%)`
        : formatBytes(p.loaded);
    const rate = p.bytesPerSecond > 0 && !done ? `, ${formatBytes(p.bytesPerSecond)}/s` : '';
    const eta = Number.isFinite(p.etaSeconds) && !done ? `, ${Math.ceil(p.etaSeconds)} s left` : '';
    const line = `spyrl: ${done ? 'downloaded' : 'downloading'} ${label} ${p.file}: ${size}${rate}${eta}`;
    if (out.isTTY) out.write(`\r\x1b[K${line}${done ? '\n' : ''}`);
    else if (done || now - lastLine >= every) {
      lastLine = now;
      out.write(`${line}\n`);
    }
  };
}
