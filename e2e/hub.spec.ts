import { expect, test } from '@playwright/test';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

// The machine has no network: the Hub's real URLs (https://huggingface.co/{repo}/resolve/main/{file}
// and the model-info API) are answered by Playwright from the bundled tiny checkpoint, so the
// app's real download, progress, cache and delete code runs end to end.
const DEMO = join(import.meta.dirname, '../public/tiny-demo');
const REPO = 'spyrl-test/tiny-qwen3';

test('loads a Hub repo with per-file progress, caches it, loads again without downloading, deletes it', async ({ context, page }, info) => {
  const files = readdirSync(DEMO).filter((f) => f !== 'manifest.json');
  const fetched: string[] = [];
  await context.route('https://huggingface.co/**', async (route) => {
    const url = new URL(route.request().url());
    fetched.push(url.pathname);
    if (url.pathname === `/api/models/${REPO}/revision/main`) {
      return route.fulfill({ json: { id: REPO, siblings: files.map((rfilename) => ({ rfilename })) } });
    }
    const m = url.pathname.match(new RegExp(`^/${REPO}/resolve/main/(.+)$`));
    if (!m || !files.includes(m[1])) return route.fulfill({ status: 404, body: 'Entry not found' });
    const body = readFileSync(join(DEMO, m[1]));
    return route.fulfill({ body, headers: { 'content-length': String(body.length), 'content-type': 'application/octet-stream' } });
  });

  await page.goto('/');
  await page.getByRole('radio', { name: /Other Hub repo/ }).check();
  await page.getByLabel('Hub repo id').fill(REPO);
  await page.getByLabel('Hub repo id').blur();
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByRole('table', { name: 'Downloads' })).toContainText('model.safetensors');
  await expect(page.getByTestId('model-status')).toContainText(REPO);
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  const downloads = fetched.filter((p) => p.includes('/resolve/'));
  expect(downloads.length).toBeGreaterThanOrEqual(3);
  await page.screenshot({ path: info.outputPath('hub-loaded.png'), fullPage: true });

  // Listed in the cache with its size.
  await page.getByText('Cached models').click();
  const cached = page.getByRole('table', { name: 'Cached models' });
  await expect(cached).toContainText(REPO);
  await expect(cached).toContainText(/\d+(\.\d+)? MiB/);

  // A second load (after a reload) downloads nothing.
  fetched.length = 0;
  await page.reload();
  await page.getByRole('radio', { name: /Other Hub repo/ }).check();
  await page.getByLabel('Hub repo id').fill(REPO);
  await page.getByLabel('Hub repo id').blur();
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText(REPO);
  expect(fetched).toEqual([]);

  // Delete empties the cache.
  await page.getByText('Cached models').click();
  await page.getByRole('button', { name: `Delete ${REPO} from the cache` }).click();
  await expect(page.getByText('No models cached in this browser yet')).toBeVisible();
});
