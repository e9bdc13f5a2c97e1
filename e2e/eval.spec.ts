// The evaluation view end to end on the bundled tiny model (SwiftShader WebGPU in a worker): two
// rounds of the small-round preset (both stage losses on the charts), then the held-out reports with base, adapter and a third
// checkpoint (the tiny demo model again, standing in for a Hub checkpoint) side by side, the
// reference, per-report scores, and the JSONL export.
import { expect, test } from '@playwright/test';
import { readFileSync } from 'node:fs';
import { pickTinyModel } from './model.ts';

const TIMEOUT = 240_000;

test('evaluates held-out reports: base, adapter and a third column side by side, exported as JSONL', async ({
  page,
}, info) => {
  test.setTimeout(480_000);
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto('./');
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await page.getByRole('button', { name: 'Quick demo' }).click();
  // Keep it fast on a software GPU: 2 held-out reports (1 GAO, 1 CRS), 64 tokens of each, 8-token summaries.
  await page.getByRole('textbox', { name: 'Held-out reports' }).fill('2');
  await page.getByLabel('Eval report tokens').fill('64');
  await page.getByLabel('Eval summary tokens').fill('8');
  await expect(page.getByRole('region', { name: 'Documents' })).toContainText('2 held out for evaluation');

  const view = page.getByRole('region', { name: 'Evaluation' });
  await expect(view.getByRole('button', { name: 'Evaluate held-out reports' })).toBeDisabled(); // no run yet
  await page.getByRole('button', { name: 'Step' }).click();
  await expect(page.getByTestId('run-status')).toContainText('1 round played', { timeout: TIMEOUT });
  await expect(page.getByTestId('run-status')).toContainText('paused');
  await page.getByRole('button', { name: 'Step' }).click();
  await expect(page.getByTestId('run-status')).toContainText('2 rounds played', { timeout: TIMEOUT });
  await expect(page.getByTestId('run-status')).toContainText('paused');

  // Two updates (roundsPerUpdate 1): both stages' losses and grad-norm shares are on the charts;
  // the KL (klBeta 0) is "off", not a line at 0.
  for (const title of ['Loss by stage', 'Grad-norm share by stage']) {
    const chart = page.getByRole('figure', { name: title });
    await expect(chart).toHaveAttribute('data-points', '2');
    await expect(chart).toContainText('summaries');
    await expect(chart).toContainText('votes');
    await expect(chart.locator('path.recharts-line-curve')).toHaveCount(2); // a drawn line per stage
  }
  await expect(page.getByRole('figure', { name: 'KL to the base model' })).toHaveAttribute('data-off', 'true');

  await view.getByLabel('Third column').selectOption('demo');
  await view.getByRole('button', { name: 'Evaluate held-out reports' }).click();
  const docs = view.getByTestId('eval-doc');
  await expect(docs).toHaveCount(2, { timeout: TIMEOUT });
  const gao = view.getByRole('article', { name: 'Held-out report ccdv_govreport_test_5' });
  await expect(gao).toContainText('the reference covers more than the input');
  for (const name of ['base model summary', /^adapter .* summary$/, /^tiny-demo .* summary$/, 'Reference summary']) {
    await expect(gao.getByRole('region', { name })).toBeVisible();
  }
  await expect(gao.locator('[data-system="adapter"] .eval-scores')).toHaveText(
    /^R-1 \d+\.\d · R-2 \d+\.\d · R-L \d+\.\d · [1-8] tokens/,
  );
  await expect(gao.getByRole('region', { name: 'Reference summary' })).toContainText('GAO');
  await expect(view.getByRole('table', { name: 'Mean scores' })).toContainText('ROUGE-L F1');
  await expect(view.getByTestId('eval-meta')).toContainText(
    'After round 2: 2 held-out reports, read up to 64 tokens, summaries of at most 8 tokens',
  );
  await page.screenshot({ path: info.outputPath('evaluation.png'), fullPage: true });

  const [download] = await Promise.all([
    page.waitForEvent('download'),
    view.getByRole('button', { name: 'Export JSONL' }).click(),
  ]);
  const file = info.outputPath('eval.jsonl');
  await download.saveAs(file);
  const lines = readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map(
      (l) => JSON.parse(l) as { id: string; results: Record<string, { summary: string; scores: { rougeL: number } }> },
    );
  expect(lines.map((l) => l.id)).toEqual(['ccdv_govreport_test_5', 'CRS_R44688']);
  for (const l of lines) expect(Object.keys(l.results)).toEqual(['base', 'adapter', 'compare']);
  expect(errors).toEqual([]);
});
