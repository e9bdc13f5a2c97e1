// A document file over the 20 MB cap is refused with its size and the cap; the documents
// already added, and the settings, are kept. A file with bytes that are not UTF-8 is added with
// a one-line warning naming it.
import { expect, test } from '@playwright/test';

test('an oversized document file is refused with its size and the cap; nothing else is lost', async ({ page }) => {
  const errors: string[] = [];
  page.on('pageerror', (e) => errors.push(e.message));
  await page.goto('./');
  // The bundled sample loads in the background: wait for it, or the count read below would change under us.
  await expect(page.getByRole('region', { name: 'Documents' })).toContainText('reports to play');
  await page.getByText('Add your own').click();
  await expect(page.getByText('At most 20 MB per file or paste')).toBeVisible(); // the cap is stated before any upload

  // One good document first: it must survive the refused upload.
  await page.getByLabel('Document files').setInputFiles({
    name: 'mine.txt',
    mimeType: 'text/plain',
    buffer: Buffer.from('The agency reviewed its budget. It found three problems.'),
  });
  await expect(page.getByRole('button', { name: 'Remove mine' })).toBeVisible();
  const plays = await page.getByText(/The next run plays \d+ reports/).innerText();

  await page
    .getByLabel('Document files')
    .setInputFiles({ name: 'huge.txt', mimeType: 'text/plain', buffer: Buffer.alloc(21 * 1024 * 1024, 'a') });
  await expect(
    page.getByRole('status').filter({ hasText: 'huge.txt: is 21.0 MB; the cap is 20.0 MB per file' }),
  ).toBeVisible();
  await expect(page.getByRole('button', { name: 'Remove mine' })).toBeVisible();
  await expect(page.getByText(/The next run plays \d+ reports/)).toHaveText(plays);

  // Not UTF-8: added, with one warning naming the file and the count.
  await page.getByLabel('Document files').setInputFiles({
    name: 'latin1.txt',
    mimeType: 'text/plain',
    buffer: Buffer.from([0x43, 0x61, 0x66, 0xe9, 0x20, 0x6f, 0x70, 0x65, 0x6e, 0x73, 0x2e, 0xff]),
  });
  await expect(
    page.getByRole('note').filter({ hasText: 'latin1.txt: 2 byte sequences not valid UTF-8' }),
  ).toBeVisible();
  await expect(page.getByRole('button', { name: 'Remove latin1' })).toBeVisible();
  await expect(page.getByRole('button', { name: 'Remove mine' })).toBeVisible();
  expect(errors).toEqual([]);
});
