// Evaluation slice: the compare view's state. Runs the held-out evaluation in the worker (base and
// adapter, and optionally a third checkpoint of the same architecture), keeps the last report,
// and exports it as JSONL (one line per held-out report).
import type { StateCreator } from 'zustand';
import { evalReportJsonl, type EvalReport } from '../train/evaluate.ts';
import { COMPARE_PRESET_REPO, errorMessage, type ModelChoice } from '../worker/protocol.ts';
import type { AppState, StoreDeps } from './store.ts';

/** The third column: none, a Hub repo (the paper's model by default) or the bundled tiny demo model. */
export type CompareKind = 'none' | 'hub' | 'demo';

export interface EvalSlice {
  evalReport: EvalReport | null;
  /** Rounds played when the report was made. */
  evalAtRound: number | null;
  evalRunning: boolean;
  evalProgress: string | null;
  evalError: string | null;
  compareKind: CompareKind;
  compareRepo: string;
  setCompare(kind: CompareKind, repo?: string): void;
  runEvaluation(): Promise<void>;
  exportEvalJsonl(): void;
}

export function compareChoice(kind: CompareKind, repo: string): ModelChoice | null {
  if (kind === 'demo') return { kind: 'demo' };
  if (kind === 'hub') return { kind: 'hub', repo: repo.trim() };
  return null;
}

export const createEvalSlice =
  (deps: StoreDeps): StateCreator<AppState, [], [], EvalSlice> =>
  (set, get) => ({
    evalReport: null,
    evalAtRound: null,
    evalRunning: false,
    evalProgress: null,
    evalError: null,
    compareKind: 'none',
    compareRepo: COMPARE_PRESET_REPO,

    setCompare(kind, repo) {
      set({ compareKind: kind, ...(repo !== undefined ? { compareRepo: repo } : {}) });
    },

    async runEvaluation() {
      const s = get();
      if (s.evalRunning) return;
      if (s.compareKind === 'hub' && !/^[\w.-]+\/[\w.-]+$/.test(s.compareRepo.trim())) {
        set({ evalError: `"${s.compareRepo}" is not a Hub repo id (owner/name)` });
        return;
      }
      set({ evalRunning: true, evalError: null, evalProgress: 'Starting' });
      try {
        const onProgress = deps.callback((p: { text: string }) => set({ evalProgress: p.text }));
        const report = await deps.engine.evaluate({ compare: compareChoice(s.compareKind, s.compareRepo) }, onProgress);
        set({ evalReport: report, evalAtRound: get().round });
      } catch (e) {
        set({ evalError: `Evaluation failed: ${errorMessage(e)}` });
      } finally {
        set({ evalRunning: false, evalProgress: null });
      }
    },

    exportEvalJsonl() {
      const r = get().evalReport;
      if (!r) return;
      deps.saveFile(
        `spyrl-eval-round-${get().evalAtRound ?? 0}.jsonl`,
        new Blob([evalReportJsonl(r)], { type: 'application/jsonl' }),
      );
    },
  });
