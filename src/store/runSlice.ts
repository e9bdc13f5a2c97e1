// Run slice: Start / Pause / Step / Reset drive the worker one round at a time (the UI's
// oneStep()); events fill the rounds and the chart series; autosave, resume and exports.
import type { StateCreator } from 'zustand';
import type { SpyRLConfig } from '../game/config.ts';
import { asModelFormat, sameFormat } from '../model/format.ts';
import { formatTuning, parseTuning, type Tuning } from '../ops/tuning.ts';
import type { TrainEvent } from '../train/events.ts';
import { errorKind, errorMessage, type PendingAdapterInfo, type SavedRunMeta } from '../worker/protocol.ts';
import { EMPTY_ROUNDS, EMPTY_SERIES, reduceRounds, reduceSeries, type RoundsState, type Series } from './rounds.ts';
import { canTransition, isBusy, transition, type RunEvent, type RunStatus } from './runStatus.ts';
import { budgetBytes } from './modelSlice.ts';
import { selectEvalDocs, selectTrainDocs } from './setupSlice.ts';
import { defaultTabLock, OTHER_TAB_MESSAGE } from './tabLock.ts';
import type { AppState, StoreDeps } from './store.ts';

export { isBusy, type RunStatus };

export interface RunSlice {
  /** Changed only through the transition table of src/store/runStatus.ts. */
  runStatus: RunStatus;
  /** Reset was pressed during a round: the run is reset when the round in flight ends. */
  resetPending: boolean;
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

/** How long a round's last events may trail the step's reply before the run goes on without them. */
const EVENTS_GRACE_MS = 5000;

export const createRunSlice =
  (deps: StoreDeps): StateCreator<AppState, [], [], RunSlice> =>
  (set, get, api) => {
    const tabLock = defaultTabLock();
    const onEvent = deps.callback((e: TrainEvent) => get().applyEvent(e));

    /** Every status change: the table's next status (it throws on an illegal event), with `patch` in the same set. */
    const move = (event: RunEvent, patch: Partial<AppState> = {}) =>
      set({ ...patch, runStatus: transition(get().runStatus, event) });

    /** Events travel on their own port, so a step's reply can overtake its last events: wait for round `r`'s. */
    const roundEvents = (r: number) =>
      new Promise<void>((resolve) => {
        const done = (s: AppState) => s.roundsState.rounds[r]?.done === true;
        if (done(get())) return resolve();
        const finish = () => (clearTimeout(timer), unsubscribe(), resolve());
        const timer = setTimeout(finish, EVENTS_GRACE_MS);
        const unsubscribe = api.subscribe((s) => void (done(s) && finish()));
      });

    const failed = (e: unknown, what: string) => {
      const lost = errorKind(e) === 'device-lost';
      const runError = lost
        ? `The GPU device was lost (${errorMessage(e)}). Reload the model to continue from the last autosave.`
        : `${what}: ${errorMessage(e)}`;
      // A reset asked for during the failed round is dropped: the error is shown and the user decides.
      const event = lost ? 'device-lost' : 'round-failed';
      if (canTransition(get().runStatus, event)) move(event, { runError, resetPending: false });
      else set({ runError }); // the run was dropped meanwhile (a model load)
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

    /** Creates the trainer (status none); true when it is ready (paused), false with the reason shown. */
    const createRun = async (): Promise<boolean> => {
      const s = get();
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
      if (!canTransition(get().runStatus, 'create')) return false; // a run appeared while the tab was claimed
      move('create', { runError: null });
      let round: number;
      try {
        ({ round } = await deps.engine.startRun(
          { config, train, evalDocs: selectEvalDocs(s), gpuMemoryBytes: budgetBytes(s.gpuBudgetGiB) },
          onEvent,
        ));
      } catch (e) {
        tabLock.release();
        move('start-failed', { runError: `Could not start the run: ${errorMessage(e)}`, resetPending: false });
        return false;
      }
      move('ready', {
        round,
        runConfig: config,
        pendingAdapter: null,
        roundsState: EMPTY_ROUNDS,
        series: EMPTY_SERIES,
        selectedRound: null,
      });
      return true;
    };

    const playRound = async (): Promise<boolean> => {
      try {
        const { round } = await deps.engine.step();
        await roundEvents(round - 1);
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
      let runError: string | null = null;
      try {
        await deps.engine.resetRun();
      } catch (e) {
        runError = errorMessage(e);
      }
      tabLock.release();
      move('reset', {
        resetPending: false,
        round: 0,
        runConfig: null,
        saved: null,
        roundsState: EMPTY_ROUNDS,
        series: EMPTY_SERIES,
        selectedRound: null,
        runError,
      });
    };

    /**
     * Plays rounds while running. Only one loop exists: it starts on 'play' from paused, and the
     * statuses that let Start in again (none, paused) are set only as a loop's last step.
     */
    const loop = async (): Promise<void> => {
      while (get().runStatus === 'running') {
        if (!(await playRound())) return; // paused with the error shown, or lost
        if (get().runStatus === 'running' && autosaveDue()) await autosave();
      }
      // Pausing: the round in flight has ended.
      if (get().runStatus !== 'pausing') return; // the run was dropped meanwhile (a model load)
      if (get().resetPending) return finishReset();
      await autosave();
      if (get().resetPending) return finishReset(); // Reset pressed during the autosave
      if (get().runStatus === 'running') return loop(); // Start pressed during the autosave: play on
      stopIfStill('pausing');
    };

    /** The round in flight and its autosave are done: wait between rounds (unless a model load dropped the run). */
    const stopIfStill = (status: 'pausing' | 'stepping') => {
      if (get().runStatus === status) move('stopped');
    };

    return {
      runStatus: 'none',
      resetPending: false,
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
        if (status === 'pausing') {
          if (!get().resetPending) move('play'); // the loop is still going: it plays on
          return;
        }
        if (status === 'none' ? !(await createRun()) : !canTransition(status, 'play')) return;
        if (get().resetPending) return finishReset(); // Reset pressed while the trainer was created
        move('play', { runError: null });
        await loop();
      },

      pause() {
        if (canTransition(get().runStatus, 'pause')) move('pause');
      },

      async step() {
        const status = get().runStatus;
        if (status === 'none' ? !(await createRun()) : !canTransition(status, 'step')) return;
        if (get().resetPending) return finishReset();
        move('step', { runError: null });
        if (!(await playRound())) return;
        await autosave();
        if (get().resetPending) return finishReset();
        stopIfStill('stepping');
      },

      async reset() {
        const status = get().runStatus;
        if (isBusy(status)) {
          // A round cannot be cut short on the GPU: reset when it ends.
          set({ resetPending: true });
          if (status === 'running') move('pause');
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
        // The engine checks every field of the save; this one decides the load, so it is checked first.
        const format = meta.format === undefined ? undefined : asModelFormat(meta.format);
        if (format === null)
          return set({
            runError: `Could not resume: the autosave's meta.json field "format" must be {weights: bf16|q4, kv: f32|f16}, got ${JSON.stringify(meta.format)}`,
          });
        // Its kernel variant overrides (a workaround for a GPU's 'auto' choice, say) come back with
        // it, unless the panel names its own: then the panel's, as for any load.
        let savedKernels: Partial<Tuning>;
        try {
          if (meta.kernels !== undefined && typeof meta.kernels !== 'string') throw new Error('must be a string');
          savedKernels = parseTuning(meta.kernels ?? '');
        } catch (e) {
          return set({
            runError: `Could not resume: the autosave's meta.json field "kernels": ${errorMessage(e)}, got ${JSON.stringify(meta.kernels)}`,
          });
        }
        const panelKernels = get().kernelSpec.trim();
        let kernels = savedKernels;
        if (panelKernels !== '') {
          try {
            kernels = parseTuning(panelKernels);
          } catch {
            kernels = {}; // the load names the panel's mistake
          }
        } else if (formatTuning(savedKernels) !== '') set({ kernelSpec: formatTuning(savedKernels) });
        // The run continues on the base it was trained on: the same model, held the same way
        // (weights format and KV type; saves from before formats existed do not say).
        const loaded = get().model;
        const same =
          loaded &&
          JSON.stringify(loaded.ref) === JSON.stringify(meta.model) &&
          (!format || sameFormat(loaded.format, format)) &&
          formatTuning(loaded.kernels) === formatTuning(kernels);
        if (!same || get().runStatus === 'lost') {
          if (meta.model.kind === 'files') {
            if (get().lastChoice?.kind !== 'files') {
              set({
                runError: `This run was trained on the local folder "${meta.model.name}": pick that folder under Model, then resume.`,
              });
              return;
            }
            if (!(await get().loadModel(get().lastChoice!, format))) return;
          } else if (
            !(await get().loadModel(
              meta.model.kind === 'demo'
                ? { kind: 'demo' }
                : { kind: 'hub', repo: meta.model.repo, revision: meta.model.revision },
              format,
            ))
          ) {
            return;
          }
        }
        if (!(await claimTab())) return; // again: loading a model drops (and releases) the old run
        if (!canTransition(get().runStatus, 'resume')) return; // a run started meanwhile
        move('resume', { runError: null });
        let r: Awaited<ReturnType<typeof deps.engine.resumeSavedRun>>;
        try {
          r = await deps.engine.resumeSavedRun(onEvent, budgetBytes(get().gpuBudgetGiB));
        } catch (e) {
          tabLock.release();
          move('start-failed', { runError: `Could not resume: ${errorMessage(e)}`, resetPending: false });
          return;
        }
        const ui = r.meta.ui as Partial<UiSnapshot> | null;
        get().setConfig(r.meta.config);
        move('ready', {
          round: r.round,
          runConfig: r.meta.config,
          roundsState: EMPTY_ROUNDS,
          series: ui?.series ?? EMPTY_SERIES,
          selectedRound: null,
          saved: r.meta,
        });
        if (get().resetPending) await finishReset(); // Reset pressed while the autosave was loading
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
        set({ resetPending: false });
        tabLock.release();
        if (get().readOnlyView && get().runStatus === 'none') return; // another tab's run, viewed: loading a model here does not end it
        move('clear', {
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
