// Picking a model the way a user sees it happen: after the choice, the app reads the model's
// config.json and shows its memory plan, which moves the Load button down. A click sent while
// that layout shift is under way can land beside the button (it did on a loaded machine), so
// the specs wait for the plan before they press Load.
import { expect, type Page } from '@playwright/test';

/** Waits until the memory plan of the chosen model is shown (its config.json has been read). */
export async function memoryPlanShown(page: Page) {
  await expect(page.getByTestId('memory-check')).toContainText('Training needs about');
}

/**
 * Picks the bundled tiny demo model and waits for its memory plan. The default option (Qwen3-4B)
 * already shows one, so the sign that the tiny model's config.json was read is the weights format
 * going from the 4B's q4 to bf16, the default below 1.5B parameters.
 */
export async function pickTinyModel(page: Page) {
  await page.getByRole('radio', { name: /Tiny demo model/ }).check();
  await expect(page.getByLabel('Weights format')).toHaveValue('bf16');
  await memoryPlanShown(page);
}
