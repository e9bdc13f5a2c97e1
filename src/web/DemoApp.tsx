import { useEffect, useRef, useState } from 'react';
import { DEFAULT_HUB_REPO, loadModel, runGeneration, type DemoModel, type GenerationStats, type ModelChoice } from './demoEngine.ts';

type Phase = 'idle' | 'loading' | 'ready' | 'generating' | 'error';

function NoWebGpu() {
  return (
    <section className="card" role="alert" aria-label="WebGPU unavailable">
      <h2>This browser has no WebGPU</h2>
      <p>SpyRL Playground runs the model on your own GPU through WebGPU. Use one of:</p>
      <ul>
        <li>Chrome or Edge 113+ on Windows, macOS or ChromeOS (on by default).</li>
        <li>Chrome on Linux: open <code>chrome://flags/#enable-unsafe-webgpu</code>, enable it and restart; or start Chrome with <code>--enable-unsafe-webgpu --enable-features=Vulkan</code>.</li>
        <li>Safari 26+ on macOS / iOS, or Firefox 141+ on Windows.</li>
      </ul>
      <p>Also check that hardware acceleration is on in the browser settings.</p>
    </section>
  );
}

export function DemoApp() {
  const hasWebGpu = typeof navigator !== 'undefined' && 'gpu' in navigator;
  const [phase, setPhase] = useState<Phase>('idle');
  const [progress, setProgress] = useState({ fraction: 0, text: '' });
  const [error, setError] = useState('');
  const [prompt, setPrompt] = useState('Summarize the purpose of a government audit in one sentence.');
  const [chat, setChat] = useState(true);
  const [maxNewTokens, setMaxNewTokens] = useState(24);
  const [temperature, setTemperature] = useState(0);
  const [output, setOutput] = useState('');
  const [stats, setStats] = useState<GenerationStats | null>(null);
  const model = useRef<DemoModel | null>(null);
  const stop = useRef(false);

  useEffect(() => () => model.current?.gpu.destroy(), []);

  const [repo, setRepo] = useState(DEFAULT_HUB_REPO);
  async function load(choice: ModelChoice) {
    setPhase('loading');
    setError('');
    try {
      model.current = await loadModel(choice, (fraction, text) => setProgress({ fraction, text }));
      setTemperature(model.current.defaults.temperature);
      setPhase('ready');
    } catch (e) {
      setError((e as Error).message);
      setPhase('error');
    }
  }

  async function generate() {
    const m = model.current;
    if (!m) return;
    setPhase('generating');
    setOutput('');
    setStats(null);
    setError('');
    stop.current = false;
    try {
      await runGeneration(
        m,
        prompt,
        { chat, maxNewTokens, temperature, topK: temperature > 0 ? m.defaults.topK : 0, topP: temperature > 0 ? m.defaults.topP : 1, seed: 0 },
        (text, s) => {
          if (text) setOutput((o) => o + text);
          setStats(s);
        },
        () => stop.current,
      );
    } catch (e) {
      setError((e as Error).message);
    }
    setPhase('ready');
  }

  const m = model.current;
  return (
    <main>
      <header>
        <h1>SpyRL Playground</h1>
        <p className="tagline">Qwen3 inference in our own WebGPU kernels, on your GPU. This page runs the bundled tiny demo model (random weights, real Qwen3 tokenizer): its text is noise, the engine is real.</p>
      </header>
      {!hasWebGpu ? (
        <NoWebGpu />
      ) : (
        <>
          <section className="card" aria-label="Model">
            <h2>Model</h2>
            {phase === 'idle' || phase === 'loading' || (phase === 'error' && !m) ? (
              <>
                <div className="row">
                  <button onClick={() => load({ kind: 'demo' })} disabled={phase === 'loading'}>Load model</button>
                  <span>the bundled tiny demo model (offline)</span>
                </div>
                <div className="row">
                  <label>Hugging Face repo <input value={repo} onChange={(e) => setRepo(e.target.value)} size={32} /></label>
                  <button onClick={() => load({ kind: 'hub', repo: repo.trim() })} disabled={phase === 'loading' || !repo.trim()}>Load from Hub</button>
                </div>
                <div className="row">
                  <label>
                    Local folder{' '}
                    <input
                      type="file"
                      aria-label="Model folder"
                      {...{ webkitdirectory: '', directory: '' }}
                      multiple
                      disabled={phase === 'loading'}
                      onChange={(e) => e.target.files?.length && load({ kind: 'files', files: [...e.target.files] })}
                    />
                  </label>
                </div>
                {phase === 'loading' && (
                  <div className="progress">
                    <progress max={1} value={progress.fraction} aria-label="Loading progress" />
                    <span>{progress.text}</span>
                  </div>
                )}
              </>
            ) : (
              m && (
                <p data-testid="model-status">
                  Loaded <strong>{m.name}</strong>: <strong>{m.cfg.numLayers}-layer Qwen3</strong> (hidden {m.cfg.hiddenSize}, {m.cfg.numHeads} heads / {m.cfg.numKvHeads} KV, vocab {m.cfg.vocabSize.toLocaleString()}) on{' '}
                  <strong>{m.gpu.info.description || m.gpu.info.architecture || 'GPU'}</strong>
                  {m.gpu.features.f16 ? ', shader-f16' : ''}{m.gpu.features.subgroups ? ', subgroups' : ''}.
                </p>
              )
            )}
          </section>
          <section className="card" aria-label="Generate">
            <h2>Generate</h2>
            <label className="field">
              Prompt
              <textarea value={prompt} onChange={(e) => setPrompt(e.target.value)} rows={3} />
            </label>
            <div className="row">
              <label><input type="checkbox" checked={chat} onChange={(e) => setChat(e.target.checked)} /> Chat template</label>
              <label>Max new tokens <input type="number" min={1} max={512} value={maxNewTokens} onChange={(e) => setMaxNewTokens(Math.max(1, Math.min(512, Number(e.target.value) || 1)))} /></label>
              <label>Temperature <input type="number" min={0} max={2} step={0.1} value={temperature} onChange={(e) => setTemperature(Math.max(0, Number(e.target.value) || 0))} /></label>
              {phase === 'generating' ? (
                <button onClick={() => (stop.current = true)}>Stop</button>
              ) : (
                <button onClick={generate} disabled={phase !== 'ready' || !prompt.trim()}>Generate</button>
              )}
            </div>
            <output aria-label="Generated text" className="output">{output}</output>
            {stats && (
              <p className="stats" data-testid="generation-stats">
                {stats.promptTokens} prompt tokens, <span data-testid="generated-count">{stats.generatedTokens}</span> generated
                {stats.tokensPerSecond > 0 ? `, ${stats.tokensPerSecond.toFixed(1)} tokens/s` : ''}
              </p>
            )}
          </section>
        </>
      )}
      {error && <p role="alert" className="error">{error}</p>}
    </main>
  );
}
