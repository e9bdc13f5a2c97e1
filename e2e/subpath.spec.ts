// The production bundle served from a sub-path, as GitHub Pages serves a project site
// (https://user.github.io/spyrl/): the page, its chunks, the engine worker, the bundled tiny
// model and the GovReport sample all load from under that path, and nothing the page asks its
// own origin for fails. Runs against `E2E_TARGET=preview` (playwright.config.ts), which builds
// with SPYRL_BASE=/spyrl/ and serves the build there with `vite preview`.
import { expect, test } from '@playwright/test';
import { pickTinyModel } from './model.ts';

test('the built app works from a sub-path: page, worker, tiny demo model and GovReport sample under it', async ({
  page,
  context,
  baseURL,
}) => {
  test.skip(
    process.env.E2E_TARGET !== 'preview',
    'the sub-path is served by the production preview (E2E_TARGET=preview)',
  );
  const base = new URL(baseURL!);
  expect(base.pathname).toBe('/spyrl/');
  const requests: string[] = [];
  const failures: string[] = [];
  // The context sees the worker's requests too (the model files are fetched from the worker).
  context.on('request', (r) => {
    const url = new URL(r.url());
    if (url.origin === base.origin) requests.push(url.pathname);
  });
  context.on('response', (r) => {
    if (new URL(r.url()).origin === base.origin && r.status() >= 400) failures.push(`${r.status()} ${r.url()}`);
  });
  context.on('requestfailed', (r) => failures.push(`${r.failure()?.errorText} ${r.url()}`));
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));

  await page.goto('./');
  await expect(page.getByRole('region', { name: 'Documents' })).toContainText('reports to play');
  await pickTinyModel(page);
  await page.getByRole('button', { name: 'Load model' }).click();
  await expect(page.getByTestId('model-status')).toContainText('2-layer Qwen3');

  // Each asset was asked for at its hashed name under the sub-path (some more than once: the memory check reads the manifest too).
  for (const asset of [
    /^\/spyrl\/assets\/main-[^/]*\.js$/,
    /^\/spyrl\/assets\/engine\.worker-[^/]*\.js$/,
    /^\/spyrl\/assets\/govreport_sample-[^/]*\.jsonl$/,
    /^\/spyrl\/tiny-demo\/manifest\.json$/,
    /^\/spyrl\/tiny-demo\/model\.safetensors$/,
    /^\/spyrl\/tiny-demo\/tokenizer\.json$/,
  ])
    expect(
      requests.some((p) => asset.test(p)),
      `a request for ${asset}`,
    ).toBe(true);
  // Every request to the page's origin stays under the sub-path, and none failed.
  expect(requests.filter((p) => !p.startsWith(base.pathname))).toEqual([]);
  expect(failures).toEqual([]);
  expect(errors).toEqual([]);
});
