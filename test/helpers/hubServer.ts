// A loopback Hugging Face Hub for tests, answering the way huggingface.co does:
//   GET /api/models/{repo}/revision/{rev}      {"sha", "siblings": [{"rfilename"}]}
//   GET /api/models/{repo}/tree/{rev}          the file list as huggingface_hub's snapshot_download reads it
//   GET|HEAD /{repo}/resolve/{rev}/{file}      X-Repo-Commit; a small file: 200, ETag = its git blob id;
//                                              an LFS file (*.safetensors): 302 to a CDN on another
//                                              origin, X-Linked-Etag = sha256, X-Linked-Size
//   a gated repo without a valid Bearer token: 401
// Every request is logged with the host it reached ('hub' or 'cdn') and its Authorization header.
import { createHash } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';

export interface HubRepo {
  /** Branch or tag -> commit sha. */
  refs: Record<string, string>;
  /** Commit sha -> files. */
  commits: Record<string, Map<string, Uint8Array>>;
  /** Requests need `Authorization: Bearer <token>`. */
  gatedToken?: string;
}

export interface HubRequest {
  host: 'hub' | 'cdn';
  method: string;
  url: string;
  auth: string | undefined;
}

export interface LoopbackHub {
  endpoint: string;
  cdn: string;
  repos: Map<string, HubRepo>;
  requests: HubRequest[];
  close(): Promise<void>;
}

export const gitBlobSha1 = (b: Uint8Array) =>
  createHash('sha1').update(`blob ${b.byteLength}\0`).update(b).digest('hex');
export const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
const isLfs = (file: string) => file.endsWith('.safetensors');

/** A folder's files (flat, as spyrl tiny-model writes them). */
export async function folderFiles(dir: string): Promise<Map<string, Uint8Array>> {
  const files = new Map<string, Uint8Array>();
  for (const name of (await readdir(dir)).sort()) files.set(name, new Uint8Array(await readFile(join(dir, name))));
  return files;
}

const listen = async (server: Server, host = '127.0.0.1') => {
  await new Promise<void>((ok, fail) => server.once('error', fail).listen(0, host, ok));
  return `http://${host}:${(server.address() as AddressInfo).port}`;
};

/** The CDN on another host name than the Hub, as huggingface.co's CDN is (huggingface_hub follows
 *  redirects within one host name): 127.0.0.2 on Linux, else `localhost`. */
async function listenElsewhere(server: Server): Promise<string> {
  try {
    return await listen(server, '127.0.0.2');
  } catch {
    const url = await listen(server);
    return url.replace('127.0.0.1', 'localhost');
  }
}

export async function startLoopbackHub(repos: Record<string, HubRepo> = {}): Promise<LoopbackHub> {
  const requests: HubRequest[] = [];
  const byRepo = new Map(Object.entries(repos));
  const blobs = new Map<string, Uint8Array>(); // sha256 -> bytes, for the CDN
  const send = (res: ServerResponse, status: number, body: string | Uint8Array = '', head = false) => {
    res.statusCode = status;
    res.setHeader('content-length', typeof body === 'string' ? Buffer.byteLength(body) : body.byteLength);
    res.end(head ? undefined : body);
  };

  const cdnServer = createServer((req, res) => {
    requests.push({ host: 'cdn', method: req.method!, url: req.url!, auth: req.headers.authorization });
    const bytes = blobs.get(/^\/blobs\/([0-9a-f]{64})$/.exec(req.url!)?.[1] ?? '');
    if (!bytes) return send(res, 404, 'no such blob');
    res.setHeader('etag', `"cdn-${sha256(bytes).slice(0, 8)}"`); // not the name of the blob: must not be used
    send(res, 200, bytes, req.method === 'HEAD');
  });
  const cdn = await listenElsewhere(cdnServer);

  const hub = (req: IncomingMessage, res: ServerResponse) => {
    requests.push({ host: 'hub', method: req.method!, url: req.url!, auth: req.headers.authorization });
    const head = req.method === 'HEAD';
    const url = new URL(req.url!, 'http://hub');
    const api = /^\/api\/models\/([^/]+\/[^/]+)\/(revision|tree)\/([^/]+)$/.exec(url.pathname);
    const file = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(url.pathname);
    const repoId = api?.[1] ?? file?.[1];
    const repo = repoId ? byRepo.get(repoId) : undefined;
    if (!repo) return send(res, 404, JSON.stringify({ error: 'Repository not found' }), head);
    if (repo.gatedToken && req.headers.authorization !== `Bearer ${repo.gatedToken}`)
      return send(res, 401, JSON.stringify({ error: 'Access to this repo is restricted' }), head);
    const rev = decodeURIComponent(api ? api[3]! : file![2]!);
    const sha = repo.commits[rev] ? rev : repo.refs[rev];
    const files = sha ? repo.commits[sha] : undefined;
    if (!sha || !files) return send(res, 404, JSON.stringify({ error: 'Revision not found' }), head);
    if (api) res.setHeader('content-type', 'application/json');
    if (api?.[2] === 'tree') {
      // huggingface_hub's snapshot_download lists files this way (one page).
      const tree = [...files].map(([path, b]) => ({
        type: 'file',
        path,
        size: b.byteLength,
        oid: gitBlobSha1(b),
        ...(isLfs(path) ? { lfs: { oid: sha256(b), size: b.byteLength, pointerSize: 134 } } : {}),
      }));
      return send(res, 200, JSON.stringify(tree), head);
    }
    if (api) {
      const siblings = [...files.keys()].map((rfilename) => ({ rfilename }));
      return send(res, 200, JSON.stringify({ id: repoId, modelId: repoId, sha, siblings, private: false }), head);
    }
    const name = file![3]!.split('/').map(decodeURIComponent).join('/');
    const bytes = files.get(name);
    if (!bytes) return send(res, 404, JSON.stringify({ error: 'Entry not found' }), head);
    res.setHeader('x-repo-commit', sha);
    if (isLfs(name)) {
      const hash = sha256(bytes);
      blobs.set(hash, bytes);
      res.setHeader('etag', `"${gitBlobSha1(new TextEncoder().encode(`oid sha256:${hash}`))}"`);
      res.setHeader('x-linked-etag', `"${hash}"`);
      res.setHeader('x-linked-size', String(bytes.byteLength));
      res.setHeader('location', `${cdn}/blobs/${hash}`);
      return send(res, 302, '', head);
    }
    res.setHeader('etag', `"${gitBlobSha1(bytes)}"`);
    send(res, 200, bytes, head);
  };
  const hubServer = createServer(hub);
  const endpoint = await listen(hubServer);
  const close = (s: Server) => new Promise<void>((ok) => s.close(() => ok()));
  return {
    endpoint,
    cdn,
    repos: byRepo,
    requests,
    close: async () => {
      hubServer.closeAllConnections();
      cdnServer.closeAllConnections();
      await Promise.all([close(hubServer), close(cdnServer)]);
    },
  };
}
