import { expect, test, type Page } from '@playwright/test';
import { pickTinyModel } from './model.ts';

const played = async (page: Page) =>
  Number((await page.locator('body').innerText()).match(/(\d+) rounds? played/)?.[1] ?? NaN);

test('Start runs rounds until Pause; keyboard shortcuts; a pasted document is added to the documents', async ({
  page,
}) => {
  test.setTimeout(420_000);
  await page.goto('./');
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await page.getByRole('button', { name: 'Quick demo' }).click();

  // A document of one's own, by paste.
  await page.getByText('Add your own').click();
  await page.getByLabel('Title').fill('my-report');
  await page
    .getByLabel('Report text')
    .fill(
      'The agency reviewed its budget. It found three problems. The first was late payments. The second was missing records. The third was unclear rules for grants. It proposed fixes for each.',
    );
  await page.getByRole('button', { name: 'Add document' }).click();
  await expect(page.getByText(/23 reports/)).toBeVisible(); // 22 bundled to play (6 held out) + this one

  // Start (the button), then rounds follow one another without further clicks.
  await page.getByRole('button', { name: 'Start' }).click();
  await expect.poll(() => played(page), { timeout: 300_000 }).toBeGreaterThanOrEqual(2);
  await page.getByRole('button', { name: 'Pause' }).click();
  await expect(page.getByText(/paused/)).toBeVisible({ timeout: 120_000 });
  const n = await played(page);
  await page.waitForTimeout(5_000);
  expect(await played(page)).toBe(n); // paused means no more rounds

  // 's' plays exactly one round.
  await page.locator('body').press('s');
  await expect.poll(() => played(page), { timeout: 120_000 }).toBe(n + 1);
  await page.waitForTimeout(5_000);
  expect(await played(page)).toBe(n + 1); // one round, not a run
});
