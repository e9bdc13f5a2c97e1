// Run slice: Start / Pause / Step / Reset drive the worker one round at a time (the UI's
// oneStep()); events fill the rounds and the chart series; autosave, resume and exports.
import type { StateCreator } from 'zustand';
import type { SpyRLConfig } from '../game/config.ts';
import type { TrainEvent } from '../train/events.ts';
import { errorMessage, errorName, type PendingAdapterInfo, type SavedRunMeta } from '../worker/protocol.ts';
import { EMPTY_ROUNDS, EMPTY_SERIES, reduceRounds, reduceSeries, type RoundsState, type Series } from './rounds.ts';
import { selectEvalDocs, selectTrainDocs } from './setupSlice.ts';
import { defaultTabLock, OTHER_TAB_MESSAGE } from './tabLock.ts';
import type { AppState, StoreDeps } from './store.ts';

/** none: no trainer; running: rounds back to back; pausing: stops after this round; stepping: one round. */
export type RunStatus = 'none' | 'starting' | 'running' | 'pausing' | 'paused' | 'stepping' | 'lost';

export interface RunSlice {
  runStatus: RunStatus;
  /** Rounds completed. */
  round: number;
  runConfig: SpyRLConfig | null;
  runError: string | null;
  saved: SavedRunMeta | null;
  pendingAdapter: PendingAdapterInfo | null;
  exporting: 'adapter' | 'log' | null;
  roundsState: RoundsState;
  /** The round the round view shows; null = follow the live round. */
  selectedRound: number | null;
  series: Series;
  /** Rounds whose reveal the voting stage has shown (roles stay hidden in the round view until then). */
  revealed: Record<number, true>;
  /** Another tab of the app owns a run (src/store/tabLock.ts): this one may only view the autosave. */
  otherTab: boolean;
  /** The screen shows the autosave's curves read-only (no trainer in this tab). */
  readOnlyView: boolean;

  start(): Promise<void>;
  pause(): void;
  step(): Promise<void>;
  reset(): Promise<void>;
  selectRound(round: number | null): void;
  markRevealed(round: number): void;
  applyEvent(e: TrainEvent): void;
  checkSaved(): Promise<void>;
  resume(): Promise<void>;
  /** Shows the autosaved run's curves and round count without loading it (the tab that owns it keeps playing). */
  viewSavedReadOnly(): Promise<void>;
  discardSaved(): Promise<void>;
  loadAdapter(files: File[]): Promise<void>;
  clearAdapter(): void;
  downloadAdapter(): Promise<void>;
  exportRunLog(): Promise<void>;
  /** Forgets the run on screen (the worker already dropped it: new model, device lost). */
  clearRunView(): void;
}

/** What autosave keeps of the UI so a resumed run keeps its curves. */
interface UiSnapshot {
  series: Series;
}

export function isBusy(status: RunStatus): boolean {
  return status === 'starting' || status === 'running' || status === 'pausing' || status === 'stepping';
}

export const createRunSlice =
  (deps: StoreDeps): StateCreator<AppState, [], [], RunSlice> =>
  (set, get) => {
    const tabLock = defaultTabLock();
    let loopActive = false;
    let resetAfterRound = false;
    // Events travel on their own port, so a step's reply can overtake its last events: wait for them.
    let lastDoneRound = -1;
    let doneWaiter: { round: number; resolve: () => void } | null = null;
    const onEvent = deps.callback((e: TrainEvent) => {
      get().applyEvent(e);
      if (e.type === 'round-done') {
        lastDoneRound = e.round;
        if (doneWaiter && e.round >= doneWaiter.round) doneWaiter.resolve();
      }
    });
    const eventsOfRound = (round: number) =>
      lastDoneRound >= round
        ? Promise.resolve()
        : new Promise<void>((resolve) => {
            const timer = setTimeout(resolve, 5000);
            doneWaiter = { round, resolve: () => (clearTimeout(timer), (doneWaiter = null), resolve()) };
          });

    const failed = (e: unknown, what: string) => {
      const lost = errorName(e) === 'GpuDeviceLostError' || /device (was )?lost/i.test(errorMessage(e));
      set({
        runStatus: lost ? 'lost' : 'paused',
        runError: lost
          ? `The GPU device was lost (${errorMessage(e)}). Reload the model to continue from the last autosave.`
          : `${what}: ${errorMessage(e)}`,
      });
    };

    /** Takes the run for this tab; false (with the reason shown) when another tab has one open. */
    const claimTab = async (): Promise<boolean> => {
      if (!(await tabLock.acquire())) {
        set({ otherTab: true, runError: OTHER_TAB_MESSAGE });
        return false;
      }
      if (get().readOnlyView) set({ readOnlyView: false, round: 0, runConfig: null, series: EMPTY_SERIES });
      set({ otherTab: false });
      return true;
    };

    /** Creates the trainer if there is none; false (with the reason shown) when it cannot. */
    const ensureRun = async (): Promise<boolean> => {
      const s = get();
      if (s.runStatus !== 'none') return true;
      if (!(await claimTab())) return false;
      if (!s.model) {
        set({ runError: 'Load a model first.' });
        return false;
      }
      const config = s.configResult.config;
      if (!config) {
        set({ runError: `Fix the settings first: ${s.configResult.error?.message}` });
        return false;
      }
      const train = selectTrainDocs(s);
      if (train.length === 0) {
        set({ runError: 'No training documents: use the bundled GovReport sample or add your own.' });
        return false;
      }
      set({ runStatus: 'starting', runError: null });
      try {
        const { round } = await deps.engine.startRun({ config, train, evalDocs: selectEvalDocs(s) }, onEvent);
        lastDoneRound = round - 1;
        set({
          round,
          runConfig: config,
          pendingAdapter: null,
          roundsState: EMPTY_ROUNDS,
          series: EMPTY_SERIES,
          selectedRound: null,
        });
        return true;
      } catch (e) {
        tabLock.release();
        set({ runStatus: 'none', runError: `Could not start the run: ${errorMessage(e)}` });
        return false;
      }
    };

    const playRound = async (): Promise<boolean> => {
      try {
        const { round } = await deps.engine.step();
        await eventsOfRound(round - 1);
        set({ round });
        return true;
      } catch (e) {
        failed(e, `Round ${get().round + 1} failed`);
        return false;
      }
    };

    const autosave = async () => {
      try {
        const snapshot: UiSnapshot = { series: get().series };
        set({ saved: await deps.engine.autosave(snapshot) });
      } catch (e) {
        set({ runError: `Autosave failed (the run goes on): ${errorMessage(e)}` });
      }
    };

    const autosaveDue = () => {
      const every = get().runConfig?.checkpointEvery ?? 0;
      return every > 0 && get().round % every === 0;
    };

    const finishReset = async () => {
      resetAfterRound = false;
      try {
        await deps.engine.resetRun();
      } catch (e) {
        set({ runError: errorMessage(e) });
      }
      tabLock.release();
      set({
        runStatus: 'none',
        round: 0,
        runConfig: null,
        saved: null,
        roundsState: EMPTY_ROUNDS,
        series: EMPTY_SERIES,
        selectedRound: null,
        runError: null,
      });
    };

    const loop = async () => {
      if (loopActive) return;
      loopActive = true;
      try {
        while (get().runStatus === 'running') {
          if (!(await playRound())) return;
          if (get().runStatus === 'running' && autosaveDue()) await autosave();
        }
        if (resetAfterRound) return await finishReset();
        if (get().runStatus === 'pausing') {
          await autosave();
          set({ runStatus: 'paused' });
        }
      } finally {
        loopActive = false;
      }
    };

    return {
      runStatus: 'none',
      round: 0,
      runConfig: null,
      runError: null,
      saved: null,
      pendingAdapter: null,
      exporting: null,
      roundsState: EMPTY_ROUNDS,
      selectedRound: null,
      series: EMPTY_SERIES,
      revealed: {},
      otherTab: false,
      readOnlyView: false,

      async start() {
        const status = get().runStatus;
        if (status === 'pausing') return set({ runStatus: 'running' }); // the loop is still going
        if (status !== 'none' && status !== 'paused') return;
        if (!(await ensureRun())) return;
        set({ runStatus: 'running', runError: null });
        await loop();
      },

      pause() {
        if (get().runStatus === 'running') set({ runStatus: 'pausing' });
      },

      async step() {
        const status = get().runStatus;
        if (status !== 'none' && status !== 'paused') return;
        if (!(await ensureRun())) return;
        set({ runStatus: 'stepping', runError: null });
        if (!(await playRound())) return;
        await autosave();
        if (resetAfterRound) return finishReset();
        set({ runStatus: 'paused' });
      },

      async reset() {
        const status = get().runStatus;
        if (isBusy(status)) {
          // A round cannot be cut short on the GPU: reset when it ends.
          resetAfterRound = true;
          if (status === 'running') set({ runStatus: 'pausing' });
          return;
        }
        await finishReset();
      },

      selectRound: (round) => set({ selectedRound: round }),
      markRevealed: (round) => set((s) => (s.revealed[round] ? s : { revealed: { ...s.revealed, [round]: true } })),

      applyEvent(e) {
        set((s) => ({ roundsState: reduceRounds(s.roundsState, e), series: reduceSeries(s.series, e) }));
      },

      async checkSaved() {
        if (get().runStatus === 'none') set({ otherTab: await tabLock.heldElsewhere() });
        try {
          set({ saved: await deps.engine.savedRun() });
        } catch {
          set({ saved: null });
        }
      },

      async viewSavedReadOnly() {
        if (get().runStatus !== 'none') return;
        await get().checkSaved(); // the owning tab may have saved since
        const meta = get().saved;
        if (!meta) return set({ runError: 'There is no autosaved run to view yet.' });
        const ui = meta.ui as Partial<UiSnapshot> | null;
        set({
          readOnlyView: true,
          round: meta.round,
          runConfig: meta.config,
          series: ui?.series ?? EMPTY_SERIES,
          roundsState: EMPTY_ROUNDS,
          selectedRound: null,
        });
      },

      async resume() {
        if (!get().saved || isBusy(get().runStatus)) return;
        if (get().runStatus === 'none' && !(await claimTab())) return;
        await get().checkSaved(); // read it again under the lock: another tab may have saved or discarded it
        const meta = get().saved;
        if (!meta) return set({ runError: 'The autosaved run is gone (discarded in another tab?).' });
        const loaded = get().model?.ref;
        const same = loaded && JSON.stringify(loaded) === JSON.stringify(meta.model);
        if (!same || get().runStatus === 'lost') {
          if (meta.model.kind === 'files') {
            if (get().lastChoice?.kind !== 'files') {
              set({
                runError: `This run was trained on the local folder "${meta.model.name}": pick that folder under Model, then resume.`,
              });
              return;
            }
            if (!(await get().loadModel(get().lastChoice!))) return;
          } else if (
            !(await get().loadModel(
              meta.model.kind === 'demo'
                ? { kind: 'demo' }
                : { kind: 'hub', repo: meta.model.repo, revision: meta.model.revision },
            ))
          ) {
            return;
          }
        }
        if (!(await claimTab())) return; // again: loading a model drops (and releases) the old run
        set({ runStatus: 'starting', runError: null });
        try {
          const r = await deps.engine.resumeSavedRun(onEvent);
          lastDoneRound = r.round - 1;
          const ui = r.meta.ui as Partial<UiSnapshot> | null;
          get().setConfig(r.meta.config);
          set({
            runStatus: 'paused',
            round: r.round,
            runConfig: r.meta.config,
            roundsState: EMPTY_ROUNDS,
            series: ui?.series ?? EMPTY_SERIES,
            selectedRound: null,
            saved: r.meta,
          });
        } catch (e) {
          tabLock.release();
          set({ runStatus: 'none', runError: `Could not resume: ${errorMessage(e)}` });
        }
      },

      async discardSaved() {
        if (!(await claimTab())) return; // never delete the autosave of a run another tab has open
        await deps.engine.discardSavedRun();
        tabLock.release();
        set({ saved: null });
      },

      async loadAdapter(files) {
        try {
          const info = await deps.engine.loadAdapter(files);
          const base = get().configResult.config ?? get().runConfig;
          if (base)
            get().setConfig({
              ...base,
              lora: {
                ...base.lora,
                r: info.r,
                alpha: info.alpha,
                targetModules: info.targetModules as SpyRLConfig['lora']['targetModules'],
              },
            });
          set({ pendingAdapter: info, runError: null });
        } catch (e) {
          set({ pendingAdapter: null, runError: `Could not use that adapter: ${errorMessage(e)}` });
        }
      },

      clearAdapter() {
        void deps.engine.clearAdapter();
        set({ pendingAdapter: null });
      },

      async downloadAdapter() {
        set({ exporting: 'adapter' });
        try {
          const zip = await deps.engine.adapterZip();
          const model = (get().model?.name ?? 'model').replace(/[^\w.-]+/g, '-');
          deps.saveFile(
            `spyrl-adapter-${model}-round${get().round}.zip`,
            new Blob([zip as Uint8Array<ArrayBuffer>], { type: 'application/zip' }),
          );
        } catch (e) {
          set({ runError: `Could not build the adapter zip: ${errorMessage(e)}` });
        } finally {
          set({ exporting: null });
        }
      },

      async exportRunLog() {
        set({ exporting: 'log' });
        try {
          const jsonl = await deps.engine.runLogJsonl();
          deps.saveFile(`spyrl-run-round${get().round}.jsonl`, new Blob([jsonl], { type: 'application/x-ndjson' }));
        } catch (e) {
          set({ runError: errorMessage(e) });
        } finally {
          set({ exporting: null });
        }
      },

      clearRunView() {
        resetAfterRound = false;
        tabLock.release();
        if (get().readOnlyView && get().runStatus === 'none') return; // another tab's run, viewed: loading a model here does not end it
        set({
          runStatus: 'none',
          round: 0,
          runConfig: null,
          pendingAdapter: null,
          roundsState: EMPTY_ROUNDS,
          series: EMPTY_SERIES,
          selectedRound: null,
        });
      },
    };
  };
