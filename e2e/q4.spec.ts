// q4 weights in the app: the tiny model chosen as q4 in the model panel (with a kernel variant
// override) plays a round to the reveal; a Hub repo loaded as q4 stores its q4 weights, and the next load reads only those.
import { expect, test, type Page } from '@playwright/test';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { pickTinyModel } from './model.ts';

const ROUND_TIMEOUT = 240_000;
const DEMO = join(import.meta.dirname, '../public/tiny-demo');
const REPO = 'spyrl-test/tiny-qwen3';
/** The commit main resolves to on the fake Hub: files are fetched and cached under it. */
const SHA = '9'.repeat(40);

test('the tiny model as q4: the panel shows the choice and its memory line, a round plays to the reveal', async ({
  page,
}, info) => {
  test.setTimeout(420_000);
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto('./');
  await pickTinyModel(page);
  const weights = page.getByLabel('Weights format');
  // Small models default to bf16, every model to an f16 KV cache.
  await expect(weights).toHaveValue('bf16');
  await expect(page.getByLabel('KV cache type')).toHaveValue('f16');
  await weights.selectOption('q4');
  await expect(page.getByTestId('weights-line')).toContainText(/q4: [\d.]+ (MiB|KiB) of weights instead of [\d.]+ MiB/);
  // A kernel variant override (the one SwiftShader picks anyway, so the round's speed is unchanged):
  // a malformed one is named as typed, and the load records the good one.
  await page.getByText('Kernel variants', { exact: true }).click();
  const kernels = page.getByLabel('Kernel variants');
  await kernels.fill('gemmF16=maybe');
  await expect(page.getByTestId('kernel-variants-problem')).toHaveText(
    'Kernel variants: gemmF16 must be one of auto, on, off (got "maybe")',
  );
  await kernels.fill('attentionBackward=row');
  await expect(page.getByTestId('kernel-variants-problem')).toHaveCount(0);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByTestId('model-format')).toContainText(/Weights q4 \([\d.]+ (MiB|KiB)\), KV cache f16/);
  await expect(page.getByTestId('model-kernels')).toHaveText('attentionBackward=row');
  await page.screenshot({ path: info.outputPath('q4-loaded.png'), fullPage: true });

  await page.getByRole('button', { name: 'Quick demo' }).click();
  await page.getByRole('button', { name: 'Step' }).click();
  const voting = page.getByRole('region', { name: 'Voting' });
  await expect(voting.getByText(/votes Player \d/).first()).toBeVisible({ timeout: ROUND_TIMEOUT });
  await expect(voting.getByTestId('reveal')).toContainText(/The spy was Player \d/, { timeout: ROUND_TIMEOUT });
  await expect(page.getByTestId('run-status')).toContainText('1 round played', { timeout: ROUND_TIMEOUT });
  await page.screenshot({ path: info.outputPath('q4-reveal.png'), fullPage: true });
  expect(errors).toEqual([]);
});

async function loadHubRepoAsQ4(page: Page) {
  await page.getByRole('radio', { name: /Other Hub repo/ }).check();
  await page.getByLabel('Hub repo id').fill(REPO);
  await page.getByLabel('Hub repo id').blur();
  await expect(page.getByLabel('Weights format')).toHaveValue('bf16'); // config.json read: a small model
  await page.getByLabel('Weights format').selectOption('q4');
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText(REPO);
}

test('a Hub repo as q4: stored after the first load, read from the q4 cache with zero downloads the next time', async ({
  context,
  page,
}, info) => {
  test.setTimeout(300_000);
  // Hub URLs answered from the bundled checkpoint (as in hub.spec.ts).
  const files = readdirSync(DEMO).filter((f) => f !== 'manifest.json');
  const fetched: string[] = [];
  await context.route('https://huggingface.co/**', async (route) => {
    const url = new URL(route.request().url());
    fetched.push(url.pathname);
    if (url.pathname === `/api/models/${REPO}/revision/main`)
      return route.fulfill({ json: { id: REPO, sha: SHA, siblings: files.map((rfilename) => ({ rfilename })) } });
    const m = url.pathname.match(new RegExp(`^/${REPO}/resolve/${SHA}/(.+)$`));
    if (!m || !files.includes(m[1]!)) return route.fulfill({ status: 404, body: 'Entry not found' });
    const body = readFileSync(join(DEMO, m[1]!));
    return route.fulfill({
      body,
      headers: { 'content-length': String(body.length), 'content-type': 'application/octet-stream' },
    });
  });

  await page.goto('./');
  await loadHubRepoAsQ4(page);
  expect(fetched).toContain(`/${REPO}/resolve/${SHA}/model.safetensors`);
  await expect(page.getByTestId('model-format')).toContainText('the q4 weights are cached');

  // Both entries listed with their format; the bf16 download is deleted, the q4 weights stay.
  await page.getByText('Cached models').click();
  const cached = page.getByRole('table', { name: 'Cached models' });
  await expect(cached.getByRole('row')).toHaveCount(2);
  await expect(cached.getByRole('row').filter({ hasText: 'bf16 download' })).toContainText(REPO);
  await expect(cached.getByRole('row').filter({ hasText: 'q4 weights' })).toContainText(/\d+(\.\d+)? MiB/);
  await page.getByRole('button', { name: `Delete ${REPO} from the cache (bf16 download)` }).click();
  await expect(cached.getByRole('row')).toHaveCount(1);
  await expect(cached).toContainText('q4 weights');
  await page.screenshot({ path: info.outputPath('q4-cached.png'), fullPage: true });

  // After a reload: one request (main -> its commit), the model comes from the q4 entry.
  fetched.length = 0;
  await page.reload();
  await loadHubRepoAsQ4(page);
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByTestId('model-format')).toContainText('read from the q4 cache');
  expect(fetched).toEqual([`/api/models/${REPO}/revision/main`]);

  await page.getByText('Cached models').click();
  await page.getByRole('button', { name: `Delete ${REPO} from the cache (q4 weights)` }).click();
  await expect(page.getByText('No models cached in this browser yet')).toBeVisible();
});
