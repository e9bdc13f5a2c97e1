// The accessibility check of the e2e suite: axe-core's WCAG 2.x A/AA rules (and its best
// practices) over the whole page, which must find nothing. Each violation is listed with its
// rule, impact and first elements, so a failure says what to fix.
import AxeBuilder from '@axe-core/playwright';
import { expect, type Page } from '@playwright/test';

async function analyze(page: Page) {
  try {
    return await new AxeBuilder({ page }).analyze();
  } catch (e) {
    // The dev server reloads the page once when it optimizes a dependency it discovers late (a
    // lazy chunk's, e.g. recharts): the analysis is then cut off by the navigation. Once more,
    // on the reloaded page; anything else is a failure.
    if (!/Execution context was destroyed|navigat/i.test(String(e))) throw e;
    await page.waitForLoadState('load');
    return await new AxeBuilder({ page }).analyze();
  }
}

export async function expectNoAxeViolations(page: Page, when: string): Promise<void> {
  const { violations } = await analyze(page);
  const found = violations.map((v) => {
    const where = v.nodes
      .slice(0, 4)
      .map((n) => `${n.target.join(' ')}${n.failureSummary ? ` [${n.failureSummary.replace(/\s+/g, ' ')}]` : ''}`)
      .join('; ');
    return `${v.id} (${v.impact}, ${v.nodes.length} element${v.nodes.length === 1 ? '' : 's'}): ${v.help}: ${where}`;
  });
  expect(found, `axe violations ${when}`).toEqual([]);
}
