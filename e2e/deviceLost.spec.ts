import { expect, test } from '@playwright/test';
import { pickTinyModel } from './model.ts';

// A lost GPU device, for real: inside the engine's worker, the next bind group destroys the
// device first. The app must say so, and offer to reload the model and resume from the autosave.
test('a lost GPU device is reported and the run resumes from its autosave', async ({ page }) => {
  test.setTimeout(420_000);
  await page.goto('./');
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await page.getByRole('button', { name: 'Quick demo' }).click();
  await page.getByRole('button', { name: 'Step' }).click();
  await expect(page.getByTestId('run-status')).toContainText('1 round played', { timeout: 300_000 });
  await expect(page.getByTestId('run-status')).toContainText('autosaved', { timeout: 60_000 });

  const worker = page.workers().find((w) => w.url().includes('engine.worker'));
  expect(worker, 'the engine worker').toBeDefined();
  await worker!.evaluate(() => {
    const create = GPUDevice.prototype.createBindGroup;
    GPUDevice.prototype.createBindGroup = function (this: GPUDevice, d: GPUBindGroupDescriptor) {
      GPUDevice.prototype.createBindGroup = create; // once
      this.destroy();
      return create.call(this, d);
    };
  });
  await page.getByRole('button', { name: 'Step' }).click();
  const alert = page.getByRole('alert', { name: 'GPU device lost' });
  await expect(alert).toContainText('lost', { timeout: 120_000 });
  await alert.getByRole('button', { name: /Reload model and resume from round 1/ }).click();
  await expect(page.getByTestId('run-status')).toContainText('1 round played · paused', { timeout: 120_000 });
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  // And it plays on.
  await page.getByRole('button', { name: 'Step' }).click();
  await expect(page.getByTestId('run-status')).toContainText('2 rounds played', { timeout: 300_000 });
});
