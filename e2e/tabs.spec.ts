// Two tabs of the app on one origin (one browser context: shared OPFS and Web Locks). The tab
// that plays owns the run; the second says so, views the autosave read-only, and cannot step,
// resume, discard or save. When the first tab closes, the second can take the run over.
import { expect, test, type Page } from '@playwright/test';
import { pickTinyModel } from './model.ts';

const ROUND_TIMEOUT = 240_000;

async function loadTinyModel(page: Page) {
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await page.getByRole('button', { name: 'Quick demo' }).click();
}

test('a second tab sees the run open elsewhere, views it read-only, and cannot step or resume it', async ({
  context,
}) => {
  test.setTimeout(540_000);
  const first = await context.newPage();
  await first.goto('./');
  await loadTinyModel(first);
  await first.getByRole('button', { name: 'Step' }).click();
  await expect(first.getByTestId('run-status')).toContainText('1 round played · paused · autosaved at round 1', {
    timeout: ROUND_TIMEOUT,
  });

  const second = await context.newPage();
  await second.goto('./');
  const notice = second.getByRole('region', { name: 'Run open in another tab' });
  await expect(notice).toBeVisible();
  await expect(second.getByRole('region', { name: 'Autosaved run' })).toHaveCount(0); // no Resume / Discard here

  // Read-only: the autosave's round count and curves, no trainer.
  await notice.getByRole('button', { name: 'View read-only' }).click();
  await expect(second.getByTestId('run-status')).toContainText('1 round played · read-only view of the autosave');
  await expect(second.getByRole('figure', { name: 'Summary reward by role' })).toHaveAttribute('data-points', '1');

  // Stepping is refused with the reason, and plays nothing.
  await loadTinyModel(second);
  await second.getByRole('button', { name: 'Step' }).click();
  await expect(
    second.getByRole('status').filter({ hasText: 'A run is open in another tab of this app' }),
  ).toBeVisible();
  await expect(second.getByTestId('run-status')).toContainText('1 round played · read-only view of the autosave');

  // The first tab plays on and autosaves; the read-only view follows on refresh.
  await first.getByRole('button', { name: 'Step' }).click();
  await expect(first.getByTestId('run-status')).toContainText('2 rounds played · paused · autosaved at round 2', {
    timeout: ROUND_TIMEOUT,
  });
  await notice.getByRole('button', { name: 'Refresh read-only view' }).click();
  await expect(second.getByTestId('run-status')).toContainText('2 rounds played · read-only view of the autosave');

  // Closing the first tab frees the run: the second may now resume it.
  await first.close();
  await second.getByRole('button', { name: 'Check again' }).click();
  await expect(notice).toHaveCount(0);
  const banner = second.getByRole('region', { name: 'Autosaved run' });
  await expect(banner).toContainText('2 rounds played');
  await banner.getByRole('button', { name: 'Resume run' }).click();
  await expect(second.getByTestId('run-status')).toContainText('2 rounds played · paused', { timeout: ROUND_TIMEOUT });
});
