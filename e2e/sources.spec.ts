import { expect, test } from '@playwright/test';
import { cpSync, mkdtempSync, statSync, truncateSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pickTinyModel } from './model.ts';

const DEMO = join(import.meta.dirname, '../public/tiny-demo');

test('loads a model from a local folder picked in the browser', async ({ page }) => {
  await page.goto('./');
  await page.getByLabel('Model folder').setInputFiles(DEMO);
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByTestId('model-status')).toContainText('tiny-demo');
});

test('a truncated safetensors file gives one clear error and the page stays usable', async ({ page }, info) => {
  const dir = join(mkdtempSync(join(tmpdir(), 'spyrl-e2e-')), 'broken-model');
  cpSync(DEMO, dir, { recursive: true });
  const st = join(dir, 'model.safetensors');
  truncateSync(st, statSync(st).size - 4096);
  await page.goto('./');
  await page.getByLabel('Model folder').setInputFiles(dir);
  await expect(page.getByRole('alert')).toContainText('model.safetensors');
  await expect(page.getByRole('alert')).toContainText('truncated');
  await page.screenshot({ path: info.outputPath('corrupt-model-error.png'), fullPage: true });
  // Still usable: the bundled model loads after the failure.
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByRole('alert')).toHaveCount(0);
});
