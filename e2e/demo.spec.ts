import { expect, test } from '@playwright/test';

test('loads the bundled tiny model in the browser and generates tokens on WebGPU', async ({ page }, info) => {
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto('/');
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByTestId('model-status')).toContainText('vocab 151,936');
  await page.getByLabel('Max new tokens').fill('6');
  await page.getByRole('button', { name: 'Generate' }).click();
  await expect(page.getByTestId('generated-count')).toHaveText(/^[1-9]\d*$/);
  await expect(page.getByRole('button', { name: 'Generate' })).toBeEnabled();
  const n = Number(await page.getByTestId('generated-count').textContent());
  expect(n).toBeGreaterThan(0);
  expect(n).toBeLessThanOrEqual(6);
  await page.screenshot({ path: info.outputPath('demo-generated.png'), fullPage: true });
  expect(errors).toEqual([]);
});

test('without WebGPU the page says which browsers and settings enable it', async ({ page }) => {
  await page.addInitScript(() => {
    Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined, configurable: true });
    delete (Navigator.prototype as { gpu?: unknown }).gpu;
  });
  await page.goto('/');
  await expect(page.getByRole('alert', { name: 'WebGPU unavailable' })).toContainText('enable-unsafe-webgpu');
  await expect(page.getByRole('button', { name: 'Load model' })).toHaveCount(0);
});
