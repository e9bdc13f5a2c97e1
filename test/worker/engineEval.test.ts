// The compare view's path without a browser: PlaygroundEngine.evaluate with the real trainer on
// the tiny model (Dawn), driven through the store's eval slice, and the JSONL export.
import { describe, expect, it } from 'vitest';
import { DEMO_URL, tinyDemoFetch } from '../helpers/tinyDemoFetch.ts';
import { validateConfig } from '../../src/game/config.ts';
import { loadGovReportNode } from '../../src/game/govreport.node.ts';
import { memoryHubCache } from '../../src/model/sources.ts';
import { createAppStore } from '../../src/store/store.ts';
import { Run } from '../../src/train/run.ts';
import type { EngineApi } from '../../src/worker/client.ts';
import { PlaygroundEngine } from '../../src/worker/engine.ts';
import { memoryRunStorage } from '../../src/worker/runStorage.ts';

describe('PlaygroundEngine.evaluate', () => {
  it('compares base, adapter and a third checkpoint on the held-out reports; the store keeps and exports the report', async () => {
    const engine = new PlaygroundEngine({
      demoUrl: () => DEMO_URL,
      fetch: await tinyDemoFetch({ layers: 1, hidden: 32, heads: 2, kvHeads: 1, headDim: 16, intermediate: 64 }),
      createTrainer: (o) => Run.create(o),
      storage: memoryRunStorage(),
      hubCache: () => memoryHubCache(),
    });
    const saved: { name: string; text: string }[] = [];
    const store = createAppStore({
      engine: engine as unknown as EngineApi,
      callback: (f) => f,
      hasWebGpu: true,
      loadBundledDocuments: loadGovReportNode,
      saveFile: (name, blob) => void blob.text().then((text) => saved.push({ name, text })),
    });
    try {
      await expect(engine.evaluate({ compare: null })).rejects.toThrow(/no model loaded/);
      await engine.loadModel({ kind: 'demo' });
      await expect(engine.evaluate({ compare: null })).rejects.toThrow(/no run/);
      const { train, eval: held } = await loadGovReportNode();
      const config = validateConfig({
        groupSize: 3,
        docTokenBudget: 32,
        summaryMaxTokens: 8,
        evalDocTokenBudget: 40,
        evalSummaryMaxTokens: 8,
        evalEvery: 0,
        lora: { r: 2, alpha: 4 },
      });
      await engine.startRun({ config, train, evalDocs: [] }, () => undefined);
      await expect(engine.evaluate({ compare: null })).rejects.toThrow(/no held-out reports/);
      await engine.startRun({ config, train, evalDocs: held.slice(0, 1) }, () => undefined);

      // Through the store, as the view does: the tiny demo model again as the third column.
      store.setState({ runStatus: 'paused', round: 0 });
      store.getState().setCompare('demo');
      await store.getState().runEvaluation();
      const s = store.getState();
      expect(s.evalError).toBeNull();
      const report = s.evalReport!;
      expect(report.systems.map((x) => x.key)).toEqual(['base', 'adapter', 'compare']);
      expect(report.systems[2]!.label).toBe('tiny-test');
      const d = report.documents[0]!;
      expect(d.id).toBe(held[0]!.id);
      expect(d.coverage).toBe('cut');
      // A fresh adapter (B = 0) is the base model, and the third column is the same checkpoint: all three agree.
      expect(d.results['adapter']!.summary).toBe(d.results['base']!.summary);
      expect(d.results['compare']!.summary).toBe(d.results['base']!.summary);
      expect(d.results['base']!.scores.tokens).toBeGreaterThan(0);

      store.getState().exportEvalJsonl();
      await new Promise((r) => setTimeout(r, 10));
      expect(saved[0]!.name).toBe('spyrl-eval-round-0.jsonl');
      expect(JSON.parse(saved[0]!.text.trim())).toMatchObject({
        id: held[0]!.id,
        coverage: 'cut',
        results: { base: {}, adapter: {}, compare: {} },
      });

      // A Hub repo id that is not one is refused before anything loads.
      store.getState().setCompare('hub', 'not a repo');
      await store.getState().runEvaluation();
      expect(store.getState().evalError).toBe('"not a repo" is not a Hub repo id (owner/name)');
    } finally {
      engine.dispose();
    }
  }, 300_000);
});
