// Start / Pause / Step / Reset with their keyboard shortcuts, the run's state, the autosave
// offer after a reload or a lost GPU, and the adapter and run-log exports.
import { useEffect } from 'react';
import { useApp, useAppGet } from '../store/hooks.ts';
import { isBusy, type RunStatus } from '../store/runSlice.ts';

const STATUS_TEXT: Record<RunStatus, string> = {
  none: 'no run yet',
  starting: 'starting the run…',
  running: 'running',
  pausing: 'pausing after this round…',
  paused: 'paused',
  stepping: 'playing one round…',
  lost: 'GPU device lost',
};

function isTyping(target: EventTarget | null): boolean {
  const el = target as HTMLElement | null;
  return !!el && (el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName));
}

/** space = start/pause, s = step, r = reset; not while typing in a field. */
export function useShortcuts() {
  const get = useAppGet();
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (e.ctrlKey || e.metaKey || e.altKey || isTyping(e.target)) return;
      const s = get();
      if (!s.model) return;
      if (e.key === ' ') {
        if (e.target instanceof HTMLButtonElement) return; // space already clicks the focused button
        e.preventDefault();
        if (s.runStatus === 'running') s.pause();
        else void s.start();
      } else if (e.key === 's') {
        void s.step();
      } else if (e.key === 'r') {
        if (
          s.runStatus !== 'none' &&
          (s.round === 0 || confirm(`Reset the run? Its ${s.round} rounds and the autosave are discarded.`))
        )
          void s.reset();
      }
    };
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, [get]);
}

export function Controls() {
  const status = useApp((s) => s.runStatus);
  const round = useApp((s) => s.round);
  const hasModel = useApp((s) => s.model !== null);
  const configOk = useApp((s) => s.configResult.config !== null || s.runStatus !== 'none');
  const start = useApp((s) => s.start);
  const pause = useApp((s) => s.pause);
  const step = useApp((s) => s.step);
  const reset = useApp((s) => s.reset);
  const saved = useApp((s) => s.saved);
  const readOnly = useApp((s) => s.readOnlyView);
  const idle = status === 'none' || status === 'paused';
  return (
    <section className="card controls" aria-label="Controls">
      <div className="row">
        {status === 'running' || status === 'pausing' ? (
          <button onClick={pause} disabled={status === 'pausing'} aria-keyshortcuts="Space">
            Pause
          </button>
        ) : (
          <button onClick={() => void start()} disabled={!hasModel || !idle || !configOk} aria-keyshortcuts="Space">
            Start
          </button>
        )}
        <button
          className="secondary"
          onClick={() => void step()}
          disabled={!hasModel || !idle || !configOk}
          aria-keyshortcuts="S"
        >
          Step
        </button>
        <button
          className="secondary"
          onClick={() => {
            if (round === 0 || confirm(`Reset the run? Its ${round} rounds and the autosave are discarded.`))
              void reset();
          }}
          disabled={status === 'none' || status === 'lost'}
          aria-keyshortcuts="R"
        >
          Reset
        </button>
        <span className="run-status" data-testid="run-status" aria-live="polite">
          <strong>{round}</strong> round{round === 1 ? '' : 's'} played ·{' '}
          {readOnly ? 'read-only view of the autosave' : STATUS_TEXT[status]}
          {saved && status !== 'none' ? ` · autosaved at round ${saved.round}` : ''}
        </span>
      </div>
      <p className="muted small">
        Keys: space start/pause · s one round · r reset. {!hasModel && 'Load a model to begin.'}
      </p>
    </section>
  );
}

export function RunNotices() {
  const saved = useApp((s) => s.saved);
  const status = useApp((s) => s.runStatus);
  const error = useApp((s) => s.runError);
  const resume = useApp((s) => s.resume);
  const discard = useApp((s) => s.discardSaved);
  const loading = useApp((s) => s.loadStatus === 'loading');
  const lastChoice = useApp((s) => s.lastChoice);
  const loadModel = useApp((s) => s.loadModel);
  const otherTab = useApp((s) => s.otherTab);
  const readOnly = useApp((s) => s.readOnlyView);
  const viewReadOnly = useApp((s) => s.viewSavedReadOnly);
  const checkSaved = useApp((s) => s.checkSaved);
  return (
    <>
      {otherTab && status === 'none' && (
        <div className="banner" role="region" aria-label="Run open in another tab">
          <p>
            A run is open in another tab of this app. That tab plays and autosaves it; this one cannot step, resume or
            save it.
          </p>
          <div className="row tight">
            <button onClick={() => void viewReadOnly()} disabled={!saved}>
              {readOnly ? 'Refresh read-only view' : 'View read-only'}
            </button>
            <button className="secondary" onClick={() => void checkSaved()}>
              Check again
            </button>
          </div>
        </div>
      )}
      {status === 'lost' && (
        <div className="banner danger" role="alert" aria-label="GPU device lost">
          <p>{error}</p>
          <button onClick={() => void (saved ? resume() : lastChoice && loadModel(lastChoice))} disabled={loading}>
            {saved ? `Reload model and resume from round ${saved.round}` : 'Reload model'}
          </button>
        </div>
      )}
      {saved && status === 'none' && !otherTab && (
        <div className="banner" role="region" aria-label="Autosaved run">
          <p>
            An autosaved run was found: <strong>{saved.modelName}</strong>, {saved.round} round
            {saved.round === 1 ? '' : 's'} played, saved {new Date(saved.savedAt).toLocaleString()}.
          </p>
          <div className="row tight">
            <button onClick={() => void resume()} disabled={loading}>
              Resume run
            </button>
            <button className="secondary" onClick={() => void discard()} disabled={loading}>
              Discard
            </button>
          </div>
        </div>
      )}
      {error && status !== 'lost' && (
        <p className="banner warning" role="status">
          {error}
        </p>
      )}
    </>
  );
}

export function AdapterPanel() {
  const status = useApp((s) => s.runStatus);
  const round = useApp((s) => s.round);
  const exporting = useApp((s) => s.exporting);
  const download = useApp((s) => s.downloadAdapter);
  const exportLog = useApp((s) => s.exportRunLog);
  const pending = useApp((s) => s.pendingAdapter);
  const loadAdapter = useApp((s) => s.loadAdapter);
  const clearAdapter = useApp((s) => s.clearAdapter);
  const hasModel = useApp((s) => s.model !== null);
  const hasRun = status !== 'none' && status !== 'starting' && status !== 'lost';
  const pick = (files: FileList | null) => {
    const list = [...(files ?? [])];
    if (list.length) void loadAdapter(list);
  };
  return (
    <section className="card" aria-label="Adapter and run">
      <h2>Adapter and run</h2>
      <div className="row">
        <button onClick={() => void download()} disabled={!hasRun || exporting !== null}>
          Download adapter
        </button>
        <button className="secondary" onClick={() => void exportLog()} disabled={!hasRun || exporting !== null}>
          Export run log (JSONL)
        </button>
        {exporting && (
          <span className="muted">
            {exporting === 'adapter' ? 'Building the zip (after the current round)…' : 'Exporting…'}
          </span>
        )}
      </div>
      <p className="muted small">
        The zip holds adapter_model.safetensors, adapter_config.json and a README model card
        {hasRun ? ` (after ${round} round${round === 1 ? '' : 's'})` : ''}; load it with PEFT on the same base model.
      </p>
      <h3>Continue from an adapter</h3>
      {pending ? (
        <p className="status" data-testid="pending-adapter">
          The next run starts from <strong>{pending.name}</strong> (r = {pending.r}, alpha = {pending.alpha},{' '}
          {pending.targetModules.join(', ')}){pending.hasOptimizerState ? ', with its optimizer state' : ''}.{' '}
          <button className="link" onClick={clearAdapter}>
            Forget it
          </button>
        </p>
      ) : (
        <div className="row tight">
          <label className="file">
            PEFT zip or files{' '}
            <input
              type="file"
              aria-label="Adapter files"
              accept=".zip,.json,.safetensors,.jsonl"
              multiple
              disabled={!hasModel || status !== 'none'}
              onChange={(e) => (pick(e.target.files), (e.target.value = ''))}
            />
          </label>
          <label className="file">
            or folder{' '}
            <input
              type="file"
              aria-label="Adapter folder"
              {...{ webkitdirectory: '', directory: '' }}
              multiple
              disabled={!hasModel || status !== 'none'}
              onChange={(e) => (pick(e.target.files), (e.target.value = ''))}
            />
          </label>
        </div>
      )}
      <p className="muted small">
        {status === 'none'
          ? 'Load the base model first; Start then continues training this adapter.'
          : 'Reset the run to continue from another adapter.'}
      </p>
    </section>
  );
}

export { isBusy };
