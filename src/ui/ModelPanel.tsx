// Model panel: pick a Qwen3 (presets, any Hub repo, a local folder, the bundled tiny model),
// see the GPU memory it needs against the adapter's limits, load it with per-file progress,
// manage the Hub cache.
import { QWEN3_PRESETS, paramCount, type Qwen3PresetName } from '../model/config.ts';
import { formatBytes } from '../worker/memoryPlan.ts';
import { useMemo } from 'react';
import { useApp, useAppShallow } from '../store/hooks.ts';
import { memoryPlanOf, selectMemoryInputs, type ModelOption } from '../store/modelSlice.ts';
import { isBusy } from '../store/runSlice.ts';

const PRESET_NOTES: Record<Qwen3PresetName, string> = {
  'Qwen/Qwen3-0.6B': 'smallest; fast rounds',
  'Qwen/Qwen3-1.7B': 'small',
  'Qwen/Qwen3-4B-Instruct-2507': 'recommended',
  'Qwen/Qwen3-8B': 'largest; needs a big GPU',
};

function ModelOptions() {
  const option = useApp((s) => s.modelOption);
  const select = useApp((s) => s.selectModelOption);
  const customRepo = useApp((s) => s.customRepo);
  const setCustomRepo = useApp((s) => s.setCustomRepo);
  const inspect = useApp((s) => s.inspectOption);
  const radio = (value: ModelOption, label: React.ReactNode) => (
    <label className="choice">
      <input type="radio" name="model" checked={option === value} onChange={() => select(value)} />
      {label}
    </label>
  );
  return (
    <fieldset className="choices">
      <legend>Model</legend>
      {(Object.keys(QWEN3_PRESETS) as Qwen3PresetName[]).map((repo) => (
        <div key={repo}>
          {radio(`preset:${repo}`, (
            <span>
              {repo} <span className="muted">· {(paramCount(QWEN3_PRESETS[repo]) / 1e9).toFixed(1)}B · {PRESET_NOTES[repo]}</span>
            </span>
          ))}
        </div>
      ))}
      <div className="row tight">
        {radio('hub', 'Other Hub repo')}
        <input
          aria-label="Hub repo id"
          placeholder="owner/name"
          value={customRepo}
          onChange={(e) => {
            setCustomRepo(e.target.value);
            select('hub');
          }}
          onBlur={() => option === 'hub' && customRepo.trim() && inspect()}
        />
      </div>
      <div>{radio('demo', <span>Tiny demo model <span className="muted">· bundled, offline, random weights</span></span>)}</div>
    </fieldset>
  );
}

function useMemoryPlan() {
  const inputs = useAppShallow(selectMemoryInputs);
  return useMemo(() => memoryPlanOf(inputs), [inputs]);
}

function MemoryCheck() {
  const plan = useMemoryPlan();
  const probe = useApp((s) => s.probe);
  const budget = useApp((s) => s.gpuBudgetGiB);
  const setBudget = useApp((s) => s.setGpuBudget);
  return (
    <div className="memory" data-testid="memory-check">
      {plan ? (
        <>
          <p>
            Training needs about <strong>{formatBytes(plan.training.total)}</strong> of GPU memory (weights {formatBytes(plan.training.weights)}, LoRA and AdamW{' '}
            {formatBytes(plan.training.lora)}, activations {formatBytes(plan.training.checkpoints + plan.training.layerWorkspace + plan.training.head)}, KV cache{' '}
            {formatBytes(plan.training.kvCache)}) for {plan.seqLen}-token sequences. Largest buffer {formatBytes(plan.training.largestBuffer.bytes)}; this GPU allows{' '}
            {formatBytes(Math.min(probe!.limits.maxBufferSize, probe!.limits.maxStorageBufferBindingSize))}.
          </p>
          {plan.problem ? <p className={plan.blocking ? 'error' : 'warning'}>{plan.problem}</p> : <p className="ok">Fits this GPU's limits{budget ? ' and your memory' : ''}.</p>}
        </>
      ) : (
        <p className="muted">{probe?.available === false ? `No GPU adapter: ${probe.reason}` : 'The memory estimate appears once the model\'s config.json is known (Hub repos: when you leave the field).'}</p>
      )}
      <label className="inline">
        Your GPU memory (GiB, optional){' '}
        <input className="num" inputMode="decimal" value={budget} onChange={(e) => setBudget(e.target.value)} aria-label="GPU memory in GiB" />
      </label>
    </div>
  );
}

function LoadProgressView() {
  const progress = useApp((s) => s.loadProgress);
  const downloads = useApp((s) => s.downloads);
  if (!progress) return null;
  return (
    <div className="progress-block">
      <div className="progress">
        <progress max={1} value={progress.stage === 'upload' ? progress.fraction : undefined} aria-label="Loading progress" />
        <span>{progress.text}</span>
      </div>
      {Object.values(downloads).length > 0 && (
        <table className="downloads" aria-label="Downloads">
          <tbody>
            {Object.values(downloads).map((d) => (
              <tr key={d.file}>
                <td>{d.file}</td>
                <td>
                  <progress max={d.total || 1} value={d.total ? d.loaded : undefined} />
                </td>
                <td>
                  {formatBytes(d.loaded)}
                  {d.total ? ` / ${formatBytes(d.total)}` : ''}
                </td>
                <td>{formatBytes(d.bytesPerSecond)}/s</td>
                <td>{d.total && d.loaded >= d.total ? 'done' : Number.isFinite(d.etaSeconds) ? `${Math.ceil(d.etaSeconds)} s left` : ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}

function CachedModels() {
  const cached = useApp((s) => s.cached);
  const del = useApp((s) => s.deleteCached);
  if (cached.length === 0) return <p className="muted small">No models cached in this browser yet (Hub downloads are kept for the next visit).</p>;
  return (
    <table className="cached" aria-label="Cached models">
      <tbody>
        {cached.map((m) => (
          <tr key={`${m.repo}@${m.revision}`}>
            <td>
              {m.repo}
              {m.revision !== 'main' ? `@${m.revision}` : ''}
            </td>
            <td>{formatBytes(m.bytes)}</td>
            <td>
              <button className="link" onClick={() => del(m.repo, m.revision)} aria-label={`Delete ${m.repo} from the cache`}>
                Delete
              </button>
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function ModelPanel() {
  const status = useApp((s) => s.loadStatus);
  const model = useApp((s) => s.model);
  const error = useApp((s) => s.modelError);
  const load = useApp((s) => s.loadModel);
  const option = useApp((s) => s.modelOption);
  const customRepo = useApp((s) => s.customRepo);
  const running = useApp((s) => isBusy(s.runStatus));
  const blocked = useMemoryPlan()?.blocking ?? false;
  const loading = status === 'loading';
  return (
    <section className="card" aria-label="Model">
      <h2>Model</h2>
      <ModelOptions />
      <MemoryCheck />
      <div className="row">
        <button onClick={() => load()} disabled={loading || running || blocked || (option === 'hub' && !customRepo.trim())}>
          Load model
        </button>
        <label className="file">
          or a local folder{' '}
          <input
            type="file"
            aria-label="Model folder"
            {...{ webkitdirectory: '', directory: '' }}
            multiple
            disabled={loading || running}
            onChange={(e) => {
              const files = [...(e.target.files ?? [])];
              e.target.value = '';
              if (files.length) void load({ kind: 'files', files });
            }}
          />
        </label>
      </div>
      <LoadProgressView />
      {model && !loading && (
        <p data-testid="model-status" className="status">
          Loaded <strong>{model.name}</strong>: <strong>{model.cfg.numLayers}-layer Qwen3</strong> (hidden {model.cfg.hiddenSize}, {model.cfg.numHeads} heads / {model.cfg.numKvHeads} KV, vocab{' '}
          {model.cfg.vocabSize.toLocaleString('en-US')}) on <strong>{model.gpu.description}</strong>
          {model.gpu.f16 ? ', shader-f16' : ''}
          {model.gpu.subgroups ? ', subgroups' : ''}.
        </p>
      )}
      {error && (
        <p role="alert" className="error">
          {error}
        </p>
      )}
      <details>
        <summary>Cached models</summary>
        <CachedModels />
      </details>
    </section>
  );
}
