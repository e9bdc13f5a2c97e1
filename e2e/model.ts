// Picking a model the way a user sees it happen: after the choice, the app reads the model's
// config.json, shows its memory plan and sets the weights format the model defaults to. The specs
// wait for that before they press Load, so the load is the one a user would start. (The plan
// once sat above the Load button and moved it under a click; it is below it now, and
// e2e/hub.spec.ts checks that the button stays put.)
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
