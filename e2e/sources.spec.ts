import { expect, test } from '@playwright/test';
import { execFileSync } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, statSync, truncateSync } from 'node:fs';
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

test('a folder written by `spyrl quantize` loads as q4 from its store, without choosing q4', async ({ page }, info) => {
  const dir = join(mkdtempSync(join(tmpdir(), 'spyrl-e2e-')), 'tiny-q4');
  execFileSync(process.execPath, [
    join(import.meta.dirname, '../bin/spyrl.mjs'),
    'quantize',
    '--model',
    DEMO,
    '--out',
    dir,
  ]);
  expect(readdirSync(dir)).toContain('model.q4.safetensors');
  expect(readdirSync(dir)).not.toContain('model.safetensors');
  await page.goto('./');
  await pickTinyModel(page);
  await expect(page.getByLabel('Weights format')).toHaveValue('bf16'); // the tiny model's default
  await page.getByLabel('Model folder').setInputFiles(dir);
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByTestId('model-format')).toContainText(/Weights q4 \([\d.]+ (MiB|KiB)\)/);
  await expect(page.getByRole('alert')).toHaveCount(0);
  // bf16 picked on purpose: one error naming the store, and the page stays usable.
  await page.getByLabel('Weights format').selectOption('bf16');
  await page.getByLabel('Model folder').setInputFiles(dir);
  await expect(page.getByRole('alert')).toContainText('model.q4.safetensors');
  await expect(page.getByRole('alert')).toContainText('holds q4 weights only');
  await page.screenshot({ path: info.outputPath('q4-folder-bf16-error.png'), fullPage: true });
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
