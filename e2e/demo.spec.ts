import { expect, test } from '@playwright/test';
import { pickTinyModel } from './model.ts';

test('loads the bundled tiny model into the worker on WebGPU', async ({ page }, info) => {
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto('./');
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByTestId('model-status')).toContainText('vocab 151,936');
  await expect(page.getByRole('button', { name: 'Start' })).toBeEnabled();
  await page.screenshot({ path: info.outputPath('model-loaded.png'), fullPage: true });
  expect(errors).toEqual([]);
});

test('without WebGPU the page says which browsers and settings enable it', async ({ page }) => {
  await page.addInitScript(() => {
    Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined, configurable: true });
    delete (Navigator.prototype as { gpu?: unknown }).gpu;
  });
  await page.goto('./');
  await expect(page.getByRole('alert', { name: 'WebGPU unavailable' })).toContainText('enable-unsafe-webgpu');
  await expect(page.getByRole('button', { name: 'Load model' })).toHaveCount(0);
});
