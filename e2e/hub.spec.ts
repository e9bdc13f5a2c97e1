import { expect, test, type BrowserContext, type Page } from '@playwright/test';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { memoryPlanShown } from './model.ts';

// The machine has no network: the Hub's real URLs (the model-info API that resolves a branch to
// its commit, and https://huggingface.co/{repo}/resolve/{sha}/{file}) are answered by Playwright
// from the bundled tiny checkpoint, so the app's real download, progress, cache and delete code
// runs end to end.
const DEMO = join(import.meta.dirname, '../public/tiny-demo');
const REPO = 'spyrl-test/tiny-qwen3';
const SHA_A = 'a0'.repeat(20);
const SHA_B = 'b0'.repeat(20);

/** Serves the tiny checkpoint at every commit; `main.sha` says which commit main is now. */
async function fakeHub(context: BrowserContext, main: { sha: string }) {
  const files = readdirSync(DEMO).filter((f) => f !== 'manifest.json');
  const fetched: string[] = [];
  await context.route('https://huggingface.co/**', async (route) => {
    const url = new URL(route.request().url());
    fetched.push(url.pathname);
    if (url.pathname === `/api/models/${REPO}/revision/main`) {
      return route.fulfill({ json: { id: REPO, sha: main.sha, siblings: files.map((rfilename) => ({ rfilename })) } });
    }
    const m = url.pathname.match(new RegExp(`^/${REPO}/resolve/([0-9a-f]{40})/(.+)$`));
    if (!m || !files.includes(m[2]!)) return route.fulfill({ status: 404, body: 'Entry not found' });
    const body = readFileSync(join(DEMO, m[2]!));
    return route.fulfill({
      body,
      headers: { 'content-length': String(body.length), 'content-type': 'application/octet-stream' },
    });
  });
  return fetched;
}

/** Picks the repo and waits for its memory plan (leaving the field reads its config.json; e2e/model.ts). */
async function pickRepo(page: Page) {
  await page.getByRole('radio', { name: /Other Hub repo/ }).check();
  await page.getByLabel('Hub repo id').fill(REPO);
  const button = page.getByRole('button', { name: 'Load model' });
  const before = await button.boundingBox();
  await page.getByLabel('Hub repo id').blur();
  await memoryPlanShown(page);
  // The plan appearing does not move the Load button: a user's click on it is what leaves the
  // repo field and reads the config, so a button that moved then would miss that click.
  expect(await button.boundingBox()).toEqual(before);
}

async function loadRepo(page: Page) {
  await pickRepo(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText(REPO);
}

test('loads a Hub repo with per-file progress, caches it, loads again without downloading, deletes it', async ({
  context,
  page,
}, info) => {
  const fetched = await fakeHub(context, { sha: SHA_A });

  await page.goto('./');
  await loadRepo(page);
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  // The per-file table stays after the load: every file fetched, each done, with its size.
  const table = page.getByRole('table', { name: 'Downloads' });
  const weightsRow = table.getByRole('row').filter({ hasText: 'model.safetensors' });
  await expect(weightsRow).toContainText('done');
  await expect(weightsRow).toContainText(/\d+(\.\d+)? (B|KiB|MiB) \/ \d+(\.\d+)? (B|KiB|MiB)/);
  await expect(table).toContainText('config.json');
  const downloads = fetched.filter((p) => p.includes('/resolve/'));
  expect(downloads.length).toBeGreaterThanOrEqual(3);
  expect(downloads.every((p) => p.startsWith(`/${REPO}/resolve/${SHA_A}/`))).toBe(true);
  await page.screenshot({ path: info.outputPath('hub-loaded.png'), fullPage: true });

  // Listed in the cache with its size, its branch and its commit.
  await page.getByText('Cached models').click();
  const cached = page.getByRole('table', { name: 'Cached models' });
  await expect(cached).toContainText(REPO);
  await expect(cached).toContainText(`@main (commit ${SHA_A.slice(0, 7)})`);
  await expect(cached).toContainText(/\d+(\.\d+)? MiB/);

  // A second load (after a reload) downloads nothing: one request resolves main to its commit.
  fetched.length = 0;
  await page.reload();
  await loadRepo(page);
  expect(fetched).toEqual([`/api/models/${REPO}/revision/main`]);

  // Delete empties the cache.
  await page.getByText('Cached models').click();
  await page.getByRole('button', { name: `Delete ${REPO} from the cache` }).click();
  await expect(page.getByText('No models cached in this browser yet')).toBeVisible();
});

test('branch row: a later load of main that moved on the Hub refetches, keyed by the new commit sha', async ({
  context,
  page,
}) => {
  const main = { sha: SHA_A };
  const fetched = await fakeHub(context, main);
  await page.goto('./');
  await loadRepo(page);
  expect(fetched.filter((p) => p.includes('/resolve/')).length).toBeGreaterThanOrEqual(3);

  // main moves to a new commit: the next load downloads again, from and under the new sha.
  main.sha = SHA_B;
  fetched.length = 0;
  await page.reload();
  await loadRepo(page);
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  expect(fetched[0]).toBe(`/api/models/${REPO}/revision/main`);
  const again = fetched.filter((p) => p.includes('/resolve/'));
  expect(again.length).toBeGreaterThanOrEqual(3);
  expect(again.every((p) => p.startsWith(`/${REPO}/resolve/${SHA_B}/`))).toBe(true);

  // Both commits are cached apart; main now names the new one.
  await page.getByText('Cached models').click();
  const cached = page.getByRole('table', { name: 'Cached models' });
  await expect(cached.getByRole('row')).toHaveCount(2);
  await expect(cached.getByRole('row').filter({ hasText: `commit ${SHA_B.slice(0, 7)}` })).toContainText('@main');
  await expect(cached.getByRole('row').filter({ hasText: `commit ${SHA_A.slice(0, 7)}` })).not.toContainText('@main');
});

test("abort row: a finished Hub download is never deleted by another tab's abort (OPFS and Cache Storage)", async ({
  page,
}) => {
  // It imports src/model/sources.ts as a module, which only the dev server serves (the
  // production bundle has no such file); the download and delete paths it guards are the same code.
  test.skip(process.env.E2E_TARGET === 'preview', 'imports a source module from the dev server');
  await page.goto('./');
  await expect(page.getByRole('button', { name: 'Load model' })).toBeVisible();
  // Two cache objects over the same origin storage share nothing in memory: each stands for a
  // tab. One evaluate runs the whole interleaving, so a dev-server reload cannot split it.
  const seen = await page.evaluate(async (repoCommit) => {
    const path = '/src/model/sources.ts';
    const m = (await import(/* @vite-ignore */ path)) as typeof import('../src/model/sources.ts');
    const out: Record<string, { text: string | null; keys: string[] }> = {};
    // Each step named, so that a failure says which one.
    const step = async <T>(label: string, run: () => Promise<T>): Promise<T> => {
      try {
        return await run();
      } catch (e) {
        throw new Error(`${label}: ${String(e)}`, { cause: e });
      }
    };
    for (const [kind, make] of [
      ['opfs', m.opfsHubCache],
      ['cache-storage', m.cacheStorageHubCache],
    ] as const) {
      const key = `${repoCommit}/${kind}.bin`;
      const tab1 = make();
      const tab2 = make();
      // Tab 1 starts downloading the file and is still writing...
      const slow = await step(`${kind}: tab 1 create`, () => tab1.create(key));
      await step(`${kind}: tab 1 write`, () => slow.write(new Uint8Array([1, 2])));
      // ...tab 2 downloads the same file to the end...
      const fast = await step(`${kind}: tab 2 create`, () => tab2.create(key));
      await step(`${kind}: tab 2 write`, () => fast.write(new TextEncoder().encode('finished')));
      await step(`${kind}: tab 2 close`, () => fast.close());
      // ...then tab 1's download fails and aborts.
      await step(`${kind}: tab 1 abort`, () => slow.abort());
      const text = await step(`${kind}: get`, async () => (await tab2.get(key))?.text() ?? null);
      const keys = (await step(`${kind}: entries`, () => tab2.entries()))
        .map((e) => e.key)
        .filter((k) => k.includes(`${kind}.bin`));
      await step(`${kind}: delete`, () => tab2.delete(key));
      out[kind] = { text, keys };
    }
    return out;
  }, `${REPO}/${SHA_A}`);
  expect(seen).toEqual({
    opfs: { text: 'finished', keys: [`${REPO}/${SHA_A}/opfs.bin`] },
    'cache-storage': { text: 'finished', keys: [`${REPO}/${SHA_A}/cache-storage.bin`] },
  });
});
