// The page: setup on the left (model, documents, settings), the game and its curves on the right.
import { lazy, Suspense, useEffect } from 'react';
import { useApp, useAppGet } from '../store/hooks.ts';
import { Charts } from './Charts.tsx';
import { AdapterPanel, Controls, RunNotices, useShortcuts } from './Controls.tsx';
import { ModelPanel } from './ModelPanel.tsx';
import { RoundPanel } from './RoundView.tsx';
import { ConfigPanel, DocumentsPanel } from './SetupPanels.tsx';
import { VotingStage } from './VotingStage.tsx';

// The compare view is its own chunk, fetched when first shown.
const EvalView = lazy(() => import('./EvalView.tsx').then((m) => ({ default: m.EvalView })));

export function NoWebGpu() {
  return (
    <section className="card" role="alert" aria-label="WebGPU unavailable">
      <h2>This browser has no WebGPU</h2>
      <p>SpyRL Playground trains the model on your own GPU through WebGPU. Use one of:</p>
      <ul>
        <li>Chrome or Edge 113+ on Windows, macOS or ChromeOS (on by default).</li>
        <li>
          Chrome on Linux: open <code>chrome://flags/#enable-unsafe-webgpu</code>, enable it and restart; or start
          Chrome with <code>--enable-unsafe-webgpu --enable-features=Vulkan</code>.
        </li>
        <li>Safari 26+ on macOS / iOS, or Firefox 141+ on Windows.</li>
      </ul>
      <p>Also check that hardware acceleration is on in the browser settings (chrome://settings/system).</p>
    </section>
  );
}

function useStartup() {
  const get = useAppGet();
  useEffect(() => {
    const s = get();
    if (!s.webgpu) return;
    void s.probeGpu();
    void s.loadBundled();
    void s.refreshCache();
    void s.checkSaved();
  }, [get]);
}

/** The tokenizer watchdog stopped the engine worker (src/worker/tokenizerWatch.ts): say which file, and that a reload is needed. */
function EngineStopped() {
  const message = useApp((s) => s.engineStopped);
  if (!message) return null;
  return (
    <section className="card" role="alert" aria-label="Engine stopped">
      <h2>The engine was stopped</h2>
      <p>{message}</p>
    </section>
  );
}

export function App() {
  const webgpu = useApp((s) => s.webgpu);
  useStartup();
  useShortcuts();
  return (
    <div className="app">
      <header className="top">
        <h1>SpyRL Playground</h1>
        <p className="tagline">
          Qwen3 trains itself on your GPU by playing <em>Who Is the Spy?</em>: players summarize a report, one of them
          from a copy with a passage removed, then everyone votes on who had the gap. Faithful, complete summaries win.
        </p>
      </header>
      {!webgpu ? (
        <NoWebGpu />
      ) : (
        <div className="layout">
          <aside className="side">
            <ModelPanel />
            <DocumentsPanel />
            <ConfigPanel />
          </aside>
          <main className="main">
            <EngineStopped />
            <RunNotices />
            <Controls />
            <RoundPanel />
            <VotingStage />
            <Charts />
            <AdapterPanel />
            <Suspense fallback={null}>
              <EvalView />
            </Suspense>
          </main>
        </div>
      )}
    </div>
  );
}
