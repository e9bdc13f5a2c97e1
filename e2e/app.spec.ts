// The playground end to end on the bundled tiny model (SwiftShader WebGPU in a worker): one
// round from documents to reveal, the curves, the adapter zip, and resume after a reload.
import { expect, test, type Page, type TestInfo } from '@playwright/test';
import { readFileSync } from 'node:fs';
import { unzipSync } from 'fflate';
import { expectNoAxeViolations } from './axe.ts';
import { pickTinyModel } from './model.ts';

const ROUND_TIMEOUT = 240_000;

async function shot(page: Page, info: TestInfo, name: string) {
  await page.screenshot({ path: info.outputPath(`${name}.png`), fullPage: true });
}

/** The header of a safetensors file: {name: {dtype, shape, data_offsets}}. */
function safetensorsHeader(bytes: Uint8Array): Record<string, { dtype: string; shape: number[] }> {
  const n = Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))) as Record<
    string,
    { dtype: string; shape: number[] }
  >;
  delete header['__metadata__'];
  return header;
}

async function loadTinyModel(page: Page) {
  await pickTinyModel(page);
  // 1 GiB of GPU memory: the plan keeps both layers' activations for the update's backward, and
  // the round below trains that way in the worker (src/train/memory.ts withKeptLayers).
  await page.getByLabel('GPU memory in GiB').fill('1');
  await expect(page.getByTestId('kept-layers')).toContainText('keeps the activations of 2 of 2 layers');
  // The tiny model's prefill activations are small beside its logits: 'auto' takes the largest chunk.
  await expect(page.getByTestId('prefill-chunk')).toContainText('prefilled 2,048 tokens at a time');
  // Its MLP (intermediate 128) is small beside the LM head's rows in a training pass: the update's
  // MLP chunks grow to the largest too, within the same memory.
  await expect(page.getByTestId('mlp-chunk')).toContainText("each layer's MLP 2,048 tokens at a time");
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  // Small rounds for a software GPU: 3 players, 96-token reports, 12-token summaries, LoRA r=4, an update every round.
  await page.getByRole('button', { name: 'Quick demo' }).click();
  await expect(page.getByLabel('Group size')).toHaveValue('3');
  await expect(page.getByLabel('Document token budget')).toHaveValue('96');
}

test('steps one round: both documents, summaries, the vote to the reveal, curves, adapter zip, resume after reload', async ({
  page,
}, info) => {
  test.setTimeout(420_000);
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto('./');
  // Accessibility at page open, once the startup reads (GPU, bundled documents) have settled.
  await expect(page.getByRole('button', { name: 'Load model' })).toBeEnabled();
  await expect(page.getByRole('region', { name: 'Documents' })).toContainText('reports to play');
  await expectNoAxeViolations(page, 'at page open');
  await loadTinyModel(page);
  await shot(page, info, '1-model-loaded');

  await page.getByRole('button', { name: 'Step' }).click();
  const full = page.getByRole('region', { name: 'Full document' });
  const spy = page.getByRole('region', { name: "Spy's document" });
  await expect(full.locator('mark')).toBeVisible({ timeout: ROUND_TIMEOUT });
  await expect(full.locator('mark')).not.toHaveText('');
  await expect(spy.locator('.gap')).toBeVisible();
  // The spy's copy lacks the highlighted span.
  const removed = (await full.locator('mark').textContent())!;
  expect(await spy.textContent()).not.toContain(removed);
  await shot(page, info, '2-round-documents');

  const voting = page.getByRole('region', { name: 'Voting' });
  await expect(voting.getByText(/votes Player \d/).first()).toBeVisible({ timeout: ROUND_TIMEOUT });
  await shot(page, info, '3-voting');
  await expect(voting.getByTestId('reveal')).toContainText(/The spy was Player \d/, { timeout: ROUND_TIMEOUT });
  await expect(page.getByRole('article').filter({ hasText: 'Spy' })).toHaveCount(1);
  await shot(page, info, '4-reveal');

  await expect(page.getByTestId('run-status')).toContainText('1 round played', { timeout: ROUND_TIMEOUT });
  await expect(page.getByTestId('run-status')).toContainText('paused');
  const rewardChart = page.getByRole('figure', { name: 'Summary reward by role' });
  await expect(rewardChart).toHaveAttribute('data-points', '1');
  await expect(rewardChart.locator('.recharts-line-dot, .recharts-dot').first()).toBeAttached();
  await expect(page.getByRole('figure', { name: 'Policy loss' })).toHaveAttribute('data-points', '1');
  // Where the round's time went: the kernels the first round compiled, every stage timed by the app's
  // clock, the update's prefix sharing and its kept layers (every one, with the 1 GiB given above),
  // and a stacked area per stage on the round-time chart.
  const d = String.raw`(?:[\d.]+ m?s|\d+ min \d\d s)`; // formatDuration
  await expect(page.getByTestId('round-time')).toHaveText(
    new RegExp(
      String.raw`^Took ${d}, \d+ GPU kernels compiled on first use included: summaries ${d} \(prefill ${d}\), votes ${d}, update ${d} \(\d+ sequences.*\), (\d+) of \1 layers' activations kept; [\d,]+ tokens/s\.$`,
    ),
  );
  const timeChart = page.getByRole('figure', { name: 'Round time by stage (s)' });
  await expect(timeChart).toHaveAttribute('data-points', '1');
  await expect(timeChart.locator('.recharts-area')).toHaveCount(4);
  await shot(page, info, '5-charts');
  // Accessibility after a round: the documents, the summaries, the vote, the reveal and the charts are all on the page.
  await expectNoAxeViolations(page, 'after a round');

  const [download] = await Promise.all([
    page.waitForEvent('download'),
    page.getByRole('button', { name: 'Download adapter' }).click(),
  ]);
  const zipPath = info.outputPath('adapter.zip');
  await download.saveAs(zipPath);
  const files = unzipSync(new Uint8Array(readFileSync(zipPath)));
  expect(Object.keys(files).sort()).toEqual(['README.md', 'adapter_config.json', 'adapter_model.safetensors']);
  const cfg = JSON.parse(new TextDecoder().decode(files['adapter_config.json']));
  expect(cfg).toMatchObject({ peft_type: 'LORA', r: 4, lora_alpha: 8, task_type: 'CAUSAL_LM' });
  const header = safetensorsHeader(files['adapter_model.safetensors']!);
  const keys = Object.keys(header);
  // Tiny model: 2 layers x 7 targets x (A, B); hidden 64, 4 heads x 16, 2 KV heads x 16, MLP 128.
  expect(keys).toHaveLength(2 * 7 * 2);
  expect(header['base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight']).toEqual({
    dtype: 'F32',
    shape: [4, 64],
    data_offsets: expect.any(Array),
  });
  expect(header['base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight']!.shape).toEqual([32, 4]);
  expect(header['base_model.model.model.layers.1.mlp.down_proj.lora_A.weight']!.shape).toEqual([4, 128]);
  const readme = new TextDecoder().decode(files['README.md']);
  expect(readme).toContain('PeftModel.from_pretrained');
  expect(readme).toContain('| rounds played | 1 |');

  // A reload mid-run offers the autosave; resuming continues at round 1 with the curves kept.
  await page.reload();
  const banner = page.getByRole('region', { name: 'Autosaved run' });
  await expect(banner).toContainText('1 round played');
  await shot(page, info, '6-resume-offer');
  await banner.getByRole('button', { name: 'Resume run' }).click();
  await expect(page.getByTestId('run-status')).toContainText('1 round played · paused');
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');
  await expect(page.getByRole('figure', { name: 'Summary reward by role' })).toHaveAttribute('data-points', '1');
  await expect(page.getByLabel('Group size')).toHaveValue('3');
  await shot(page, info, '7-resumed');
  expect(errors).toEqual([]);
});
