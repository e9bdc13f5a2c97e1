// `--model OWNER/NAME[@REV]`: the Hub through the shared loader, files in the Hugging Face cache
// exactly as huggingface_hub lays it out (blobs by ETag, snapshot symlinks, refs), HF_HUB_OFFLINE,
// HF_TOKEN to the Hub only. Against a loopback Hub (test/helpers/hubServer.ts), hand-built caches,
// and, when the reference venv is there, huggingface_hub itself as the outside oracle.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, readlink, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  folderFiles,
  gitBlobSha1,
  sha256,
  startLoopbackHub,
  type HubRequest,
  type LoopbackHub,
} from '../helpers/hubServer.ts';
import { ROOT, spyrl, spyrlWith } from '../helpers/spyrl.ts';

const SHA = '1234abcd'.repeat(5);
const GATED_SHA = 'feedbeef'.repeat(5);
const HANDMADE_SHA = '0badf00d'.repeat(5);
const TOKEN = 'hf_secret_abc123';
const PYTHON = join(ROOT, '.venv-ref/bin/python');

let tmp: string, model: string, files: Map<string, Uint8Array>, hub: LoopbackHub, expected: Buffer;

/** The blob name huggingface_hub gives a file: its sha256 when LFS (the weights), else its git blob id. */
const blobName = (file: string, b: Uint8Array) => (file.endsWith('.safetensors') ? sha256(b) : gitBlobSha1(b));

/** Float32 logits of two tokens through `--model spec` (a real GPU run), with `env`. */
async function logits(spec: string, env: Record<string, string | undefined>, out: string) {
  const r = await spyrlWith({ env }, 'logits', '--model', spec, '--tokens', '1,2,3', '--out', join(tmp, out));
  return { ...r, bytes: r.code === 0 ? await readFile(join(tmp, out)) : null };
}

const hubEnv = (cache: string, extra: Record<string, string | undefined> = {}) => ({
  HF_ENDPOINT: hub.endpoint,
  HF_HUB_CACHE: join(tmp, cache),
  HF_TOKEN: undefined,
  HF_HOME: join(tmp, 'hf-home-empty'),
  HF_HUB_OFFLINE: undefined,
  ...extra,
});

const urls = (rs: HubRequest[]) => rs.map((r) => `${r.host} ${r.url}`);

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-hubcache-'));
  model = join(tmp, 'tiny');
  const tiny = ['--layers', '1', '--hidden', '32', '--heads', '2', '--kv-heads', '1', '--head-dim', '16'];
  expect((await spyrl('tiny-model', '--out', model, ...tiny, '--intermediate', '64', '--vocab', '300')).code).toBe(0);
  files = await folderFiles(model);
  hub = await startLoopbackHub({
    'test-org/tiny': { refs: { main: SHA }, commits: { [SHA]: files } },
    'test-org/gated': { refs: { main: GATED_SHA }, commits: { [GATED_SHA]: files }, gatedToken: TOKEN },
    'test-org/handmade': { refs: { main: HANDMADE_SHA }, commits: { [HANDMADE_SHA]: files } },
  });
  const fromFolder = await logits(model, {}, 'folder.bin');
  expect(fromFolder.code, fromFolder.stderr).toBe(0);
  expected = fromFolder.bytes!;
}, 120_000);

afterAll(async () => {
  await hub?.close();
  await rm(tmp, { recursive: true, force: true });
});

describe('spyrl --model OWNER/NAME[@REV] and the Hugging Face cache', () => {
  it('downloads into models--org--name/{blobs,snapshots,refs} as huggingface_hub does, the token to the Hub only, progress on stderr', async () => {
    hub.requests.length = 0;
    const r = await logits('test-org/tiny', hubEnv('hf', { HF_TOKEN: TOKEN }), 'hub.bin');
    expect(r.code, r.stderr).toBe(0);
    expect(r.bytes!.equals(expected)).toBe(true); // the same model as the folder
    expect(r.stdout + r.stderr).not.toContain(TOKEN);
    // Not a terminal: one line per file once it is downloaded (stdout keeps only the result).
    expect(r.stderr.split('\n').sort()).toEqual(
      [...files.keys()].map((f) =>
        expect.stringMatching(new RegExp(`^spyrl: downloaded test-org/tiny@1234abc ${f.replace('.', '\\.')}: `)),
      ),
    );
    expect(r.stdout.trim()).toBe('{"tokens":[1,2,3],"shape":[3,300]}');

    const repo = join(tmp, 'hf', 'models--test-org--tiny');
    expect(await readFile(join(repo, 'refs', 'main'), 'utf8')).toBe(SHA);
    expect((await readdir(join(repo, 'snapshots'))).sort()).toEqual([SHA]);
    for (const [file, bytes] of files) {
      const link = join(repo, 'snapshots', SHA, file);
      expect(await readlink(link)).toBe(`../../blobs/${blobName(file, bytes)}`);
      expect(Buffer.from(await readFile(link)).equals(Buffer.from(bytes))).toBe(true);
    }
    expect((await readdir(join(repo, 'blobs'))).sort()).toEqual([...files].map(([f, b]) => blobName(f, b)).sort());

    // The Hub saw the token on every request; the CDN it redirected the weights to never did.
    const hubReqs = hub.requests.filter((q) => q.host === 'hub');
    const cdnReqs = hub.requests.filter((q) => q.host === 'cdn');
    expect(hubReqs.every((q) => q.auth === `Bearer ${TOKEN}`)).toBe(true);
    expect(cdnReqs.length).toBe(1);
    expect(cdnReqs[0]!.auth).toBeUndefined();
    expect(urls(hubReqs)).toContain('hub /api/models/test-org/tiny/revision/main');
    expect(hubReqs.filter((q) => q.url.includes('/resolve/')).every((q) => q.url.includes(`/resolve/${SHA}/`))).toBe(
      true,
    );
  }, 120_000);

  it('reuses the cache (only the revision is asked) and, with HF_HUB_OFFLINE=1, makes no request at all', async () => {
    hub.requests.length = 0;
    const again = await logits('test-org/tiny@main', hubEnv('hf'), 'again.bin');
    expect(again.code, again.stderr).toBe(0);
    expect(again.bytes!.equals(expected)).toBe(true);
    expect(again.stderr).toBe('');
    expect(urls(hub.requests)).toEqual(['hub /api/models/test-org/tiny/revision/main']);

    hub.requests.length = 0;
    for (const spec of ['test-org/tiny', `test-org/tiny@${SHA}`]) {
      const off = await logits(spec, hubEnv('hf', { HF_HUB_OFFLINE: '1' }), 'offline.bin');
      expect(off.code, off.stderr).toBe(0);
      expect(off.bytes!.equals(expected)).toBe(true);
    }
    expect(hub.requests).toEqual([]);
  }, 120_000);

  it('the Hub unreachable (no HF_HUB_OFFLINE): the commit from refs/ and the files from snapshots/, with one warning', async () => {
    const r = await spyrlWith(
      { env: hubEnv('hf', { HF_ENDPOINT: 'http://127.0.0.1:9' }) },
      'memory',
      '--model',
      'test-org/tiny',
    );
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout).total).toBeGreaterThan(0);
    expect(r.stderr).toMatch(
      /^spyrl: warning: test-org\/tiny: the Hub could not be reached \(http:\/\/127\.0\.0\.1:9\/api\/models\/test-org\/tiny\/revision\/main could not be reached: .*\); using commit 1234abc, what "main" was on an earlier load here, which may be out of date$/,
    );
  }, 60_000);

  it('HF_HUB_OFFLINE=1 without the revision in the cache: one error naming the repo, revision and cache, no request', async () => {
    hub.requests.length = 0;
    const cache = join(tmp, 'hf');
    for (const [spec, where] of [
      ['test-org/tiny@v2', join(cache, 'models--test-org--tiny', 'refs', 'v2')],
      [`test-org/other@${HANDMADE_SHA}`, join(cache, 'models--test-org--other', 'snapshots', HANDMADE_SHA)],
    ] as const) {
      const r = await spyrlWith({ env: hubEnv('hf', { HF_HUB_OFFLINE: '1' }) }, 'memory', '--model', spec);
      expect(r.code).toBe(1);
      expect(r.stdout).toBe('');
      expect(r.stderr.split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(
        `spyrl: error: ${spec}: HF_HUB_OFFLINE is set and this revision is not in the Hugging Face cache ${cache} `,
      );
      expect(r.stderr).toContain(where);
    }
    expect(hub.requests).toEqual([]);
  }, 60_000);

  it('reads a cache laid out by huggingface_hub (relative symlinks into blobs/, refs/main): offline, and online without downloading', async () => {
    const repo = join(tmp, 'hf-handmade', 'models--test-org--handmade');
    await mkdir(join(repo, 'blobs'), { recursive: true });
    await mkdir(join(repo, 'snapshots', HANDMADE_SHA), { recursive: true });
    await mkdir(join(repo, 'refs'), { recursive: true });
    await writeFile(join(repo, 'refs', 'main'), HANDMADE_SHA);
    for (const [file, bytes] of files) {
      await writeFile(join(repo, 'blobs', blobName(file, bytes)), bytes);
      await symlink(`../../blobs/${blobName(file, bytes)}`, join(repo, 'snapshots', HANDMADE_SHA, file));
    }
    hub.requests.length = 0;
    const off = await logits('test-org/handmade', hubEnv('hf-handmade', { HF_HUB_OFFLINE: '1' }), 'hm-off.bin');
    expect(off.code, off.stderr).toBe(0);
    expect(off.bytes!.equals(expected)).toBe(true);
    expect(hub.requests).toEqual([]);
    const on = await logits('test-org/handmade', hubEnv('hf-handmade'), 'hm-on.bin');
    expect(on.code, on.stderr).toBe(0);
    expect(on.bytes!.equals(expected)).toBe(true);
    expect(urls(hub.requests)).toEqual(['hub /api/models/test-org/handmade/revision/main']);
  }, 120_000);

  it('a gated repo: HTTP 401 without a token says to set HF_TOKEN; a refused token is never printed; the HF_HOME/token file works', async () => {
    const noToken = await spyrlWith({ env: hubEnv('hf-gated') }, 'memory', '--model', 'test-org/gated');
    expect(noToken.code).toBe(1);
    expect(noToken.stderr).toBe(
      'spyrl: error: test-org/gated@main: HTTP 401 from the Hub: a gated or private repo needs a token: set HF_TOKEN (or run huggingface-cli login) with access to it',
    );
    const wrong = 'hf_wrong_token_987';
    const refused = await spyrlWith(
      { env: hubEnv('hf-gated', { HF_TOKEN: wrong }) },
      'memory',
      '--model',
      'test-org/gated',
    );
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /^spyrl: error: test-org\/gated@main: HTTP 401 from the Hub: the token .* does not give access to it$/,
    );
    expect(refused.stdout + refused.stderr).not.toContain(wrong);

    const home = join(tmp, 'hf-home');
    await mkdir(home, { recursive: true });
    await writeFile(join(home, 'token'), `${TOKEN}\n`);
    hub.requests.length = 0;
    const ok = await spyrlWith({ env: hubEnv('hf-gated', { HF_HOME: home }) }, 'memory', '--model', 'test-org/gated');
    expect(ok.code, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout).total).toBeGreaterThan(0);
    expect(ok.stdout + ok.stderr).not.toContain(TOKEN);
    expect(hub.requests.map((q) => q.auth)).toEqual([`Bearer ${TOKEN}`, `Bearer ${TOKEN}`]); // revision, config.json
  }, 60_000);

  it('a path that is neither a folder nor a repo the Hub has: one error naming both', async () => {
    const r = await spyrlWith({ env: hubEnv('hf') }, 'memory', '--model', 'no-such/folder');
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(
      'spyrl: error: no-such/folder@main: HTTP 404 from the Hub: no such repo or revision (nor a local folder "no-such/folder")',
    );
    const local = await spyrl('memory', '--model', join(tmp, 'missing-folder'));
    expect(local.stderr).toBe(`spyrl: error: ${join(tmp, 'missing-folder')}: model folder not found`);
  }, 60_000);
});

// The outside oracle: huggingface_hub reads the cache our CLI wrote, and our CLI reads the cache
// huggingface_hub wrote (snapshot_download from the same loopback Hub).
const venv = existsSync(PYTHON);
if (!venv)
  console.log(`hubCache.test.ts: huggingface_hub oracle skipped: no ${PYTHON} (see the preamble to create it)`);

describe.skipIf(!venv)('huggingface_hub agrees on the layout', () => {
  const python = async (code: string, env: Record<string, string | undefined>) =>
    (
      await promisify(execFile)(PYTHON, ['-c', code], {
        env: { ...process.env, HF_HUB_DISABLE_XET: '1', HF_HUB_DISABLE_TELEMETRY: '1', HF_TOKEN: undefined, ...env },
      })
    ).stdout;

  it('scan_cache_dir and try_to_load_from_cache find every file the CLI downloaded', async () => {
    // The cache the first test downloaded into (downloaded here when that test did not run).
    const cache = join(tmp, 'hf');
    if (!existsSync(join(cache, 'models--test-org--tiny'))) {
      const r = await logits('test-org/tiny', hubEnv('hf'), 'oracle.bin');
      expect(r.code, r.stderr).toBe(0);
    }
    const out = await python(
      `
import json, sys, huggingface_hub as h
info = h.scan_cache_dir(${JSON.stringify(cache)})
repos = [{"id": r.repo_id, "type": r.repo_type, "revisions": [{"sha": v.commit_hash, "refs": sorted(v.refs),
  "files": sorted(f.file_name for f in v.files), "size": v.size_on_disk} for v in r.revisions]} for r in info.repos]
paths = {f: h.try_to_load_from_cache("test-org/tiny", f, cache_dir=${JSON.stringify(cache)}) for f in ${JSON.stringify([...files.keys()])}}
print(json.dumps({"warnings": [str(w) for w in info.warnings], "repos": repos, "paths": paths}))
`,
      {},
    );
    const got = JSON.parse(out);
    expect(got.warnings).toEqual([]);
    const size = [...files.values()].reduce((n, b) => n + b.byteLength, 0);
    expect(got.repos).toEqual([
      {
        id: 'test-org/tiny',
        type: 'model',
        revisions: [{ sha: SHA, refs: ['main'], files: [...files.keys()].sort(), size }],
      },
    ]);
    for (const f of files.keys()) expect(got.paths[f]).toBe(join(cache, 'models--test-org--tiny', 'snapshots', SHA, f));
  }, 120_000);

  it('the CLI reads offline what huggingface_hub snapshot_download wrote', async () => {
    const cache = join(tmp, 'hf-python');
    await python(
      `import huggingface_hub as h; h.snapshot_download("test-org/tiny", cache_dir=${JSON.stringify(cache)})`,
      {
        HF_ENDPOINT: hub.endpoint,
      },
    );
    hub.requests.length = 0;
    const r = await logits('test-org/tiny', hubEnv('hf-python', { HF_HUB_OFFLINE: '1' }), 'python.bin');
    expect(r.code, r.stderr).toBe(0);
    expect(r.bytes!.equals(expected)).toBe(true);
    expect(hub.requests).toEqual([]);
  }, 120_000);
});
