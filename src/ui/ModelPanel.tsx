// Model panel: pick a Qwen3 (presets, any Hub repo, a local folder, the bundled tiny model),
// see the GPU memory it needs against the adapter's limits, load it with per-file progress,
// manage the Hub cache.
import { QWEN3_PRESETS, paramCount, type Qwen3PresetName } from '../model/config.ts';
import { DEFAULT_MLP_CHUNK, FORWARD_CHUNK, formatBytes, type RoundPhase } from '../train/memory.ts';
import { useMemo } from 'react';
import { useApp, useAppShallow } from '../store/hooks.ts';
import {
  kernelSpecProblem,
  memoryPlanOf,
  selectFormatInputs,
  selectMemoryInputs,
  type ModelOption,
} from '../store/modelSlice.ts';
import { formatTuning, TUNING_CHOICES } from '../ops/tuning.ts';
import { type KvType, type WeightsFormat } from '../model/format.ts';
import { weightBytes } from '../train/memory.ts';
import type { CacheFormat } from '../model/sources.ts';
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
          {radio(
            `preset:${repo}`,
            <span>
              {repo}{' '}
              <span className="muted">
                · {(paramCount(QWEN3_PRESETS[repo]) / 1e9).toFixed(1)}B · {PRESET_NOTES[repo]}
              </span>
            </span>,
          )}
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
      <div>
        {radio(
          'demo',
          <span>
            Tiny demo model <span className="muted">· bundled, offline, random weights</span>
          </span>,
        )}
      </div>
    </fieldset>
  );
}

const CACHE_FORMAT_LABEL: Record<CacheFormat, string> = { bf16: 'bf16 download', q4: 'q4 weights' };

/** Weights format and KV-cache type of the next load, with what q4 saves for this model. */
function FormatChoice() {
  const { cfg, weights, kv, q4Problem } = useAppShallow(selectFormatInputs);
  const setWeights = useApp((s) => s.setWeights);
  const setKv = useApp((s) => s.setKv);
  const bf16 = cfg ? weightBytes(cfg, 'bf16').total : 0;
  const q4 = cfg && !q4Problem ? weightBytes(cfg, 'q4').total : 0;
  let line: string;
  if (!cfg) line = 'q4 from 1.5B parameters, bf16 below: decided once config.json is known.';
  else if (weights === 'q4')
    line = `q4: ${formatBytes(q4)} of weights instead of ${formatBytes(bf16)}; 4-bit with one f16 scale per 32 weights, so logits drift slightly from bf16.`;
  else
    line = `bf16: ${formatBytes(bf16)} of weights, exactly as downloaded${q4 ? ` (q4 would take ${formatBytes(q4)})` : ''}.`;
  return (
    <div className="format" data-testid="model-format-choice">
      <div className="row tight">
        <label className="inline">
          Weights{' '}
          <select
            aria-label="Weights format"
            value={weights ?? 'auto'}
            onChange={(e) => setWeights(e.target.value as WeightsFormat)}
          >
            {weights === null && <option value="auto">auto</option>}
            <option value="bf16">bf16</option>
            <option value="q4" disabled={q4Problem !== null}>
              q4
            </option>
          </select>
        </label>
        <label className="inline">
          KV cache{' '}
          <select aria-label="KV cache type" value={kv} onChange={(e) => setKv(e.target.value as KvType)}>
            <option value="f16">f16</option>
            <option value="f32">f32</option>
          </select>
        </label>
      </div>
      <p className="small" data-testid="weights-line">
        {line} KV cache {kv}
        {kv === 'f16' ? ': half the memory of f32' : ''}.
      </p>
      {q4Problem && <p className="small muted">q4 is unavailable: {q4Problem}.</p>}
      <KernelVariants />
    </div>
  );
}

/**
 * Overrides of the kernels' automatic choices for the next load (`name=value,...`, the CLI's
 * --kernels): the way out where a GPU default misbehaves, e.g. gemmF16=off.
 */
function KernelVariants() {
  const spec = useApp((s) => s.kernelSpec);
  const setSpec = useApp((s) => s.setKernelSpec);
  const problem = kernelSpecProblem(spec);
  return (
    <details className="kernel-variants" open={spec.trim() !== '' || undefined}>
      <summary>Kernel variants</summary>
      <label className="inline">
        Overrides{' '}
        <input
          aria-label="Kernel variants"
          placeholder="none: every kernel picks for this GPU"
          value={spec}
          spellCheck={false}
          onChange={(e) => setSpec(e.target.value)}
          aria-invalid={problem !== null}
        />
      </label>
      {problem ? (
        <p className="small error" data-testid="kernel-variants-problem">
          Kernel variants: {problem}
        </p>
      ) : (
        <p className="small muted">
          name=value, comma-separated, applied at the next load; e.g. <code>gemmF16=off</code> turns off the f16 prefill
          GEMM. Switches:{' '}
          {(Object.keys(TUNING_CHOICES) as (keyof typeof TUNING_CHOICES)[])
            .map((k) => `${k} (${TUNING_CHOICES[k].join(', ')})`)
            .join('; ')}
          .
        </p>
      )}
    </details>
  );
}

function useMemoryPlan() {
  const inputs = useAppShallow(selectMemoryInputs);
  return useMemo(() => memoryPlanOf(inputs), [inputs]);
}

const PHASE_LABEL: Record<RoundPhase, string> = {
  load: 'loading (q4)',
  summaries: 'summaries',
  reasons: 'vote reasons',
  votes: 'votes',
  eval: 'evaluation',
  update: 'LoRA update',
};

/** The round's memory plan (src/train/memory.ts, the same the CLI checks): the peak, and each phase. */
function MemoryCheck() {
  const check = useMemoryPlan();
  const probe = useApp((s) => s.probe);
  const budget = useApp((s) => s.gpuBudgetGiB);
  const setBudget = useApp((s) => s.setGpuBudget);
  const p = check?.plan;
  return (
    <div className="memory" data-testid="memory-check">
      {check && p ? (
        <>
          <p>
            Training needs about <strong>{formatBytes(p.total)}</strong> of GPU memory at its peak (
            {PHASE_LABEL[p.peakPhase]}): weights {formatBytes(p.weights)} ({p.options.weights}), LoRA and AdamW{' '}
            {formatBytes(p.lora)}, KV cache {formatBytes(p.kv)} ({p.options.kv}), activations{' '}
            {formatBytes(p.activations)}, workspace {formatBytes(p.workspace)}. Largest buffer{' '}
            {formatBytes(p.largestBuffer.bytes)}; this GPU allows{' '}
            {formatBytes(Math.min(probe!.limits.maxBufferSize, probe!.limits.maxStorageBufferBindingSize))}.
          </p>
          <table className="small" aria-label="GPU memory by phase of a round">
            <thead>
              <tr>
                <th>phase</th>
                <th>KV cache</th>
                <th>activations</th>
                <th>total</th>
              </tr>
            </thead>
            <tbody>
              {p.phases.map((ph) => (
                <tr key={ph.phase}>
                  <td>{PHASE_LABEL[ph.phase]}</td>
                  <td>{formatBytes(ph.kv)}</td>
                  <td>{formatBytes(ph.activations)}</td>
                  <td>{ph.phase === p.peakPhase ? <strong>{formatBytes(ph.total)}</strong> : formatBytes(ph.total)}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {check.problem ? (
            <p className={check.blocking ? 'error' : 'warning'}>{check.problem}</p>
          ) : (
            <p className="ok">Fits this GPU's limits{budget ? ' and your memory' : ''}.</p>
          )}
          {p.keepLayers > 0 && !check.problem ? (
            <p className="muted" data-testid="kept-layers">
              The LoRA update keeps the activations of {p.keepLayers} of {p.cfg.numLayers} layers for its backward
              instead of recomputing them (less work per update), in memory{' '}
              {budget ? 'within your GPU memory' : 'the round needs anyway'}.
            </p>
          ) : null}
          {p.mlpChunk > DEFAULT_MLP_CHUNK && !check.problem ? (
            <p className="muted" data-testid="mlp-chunk">
              The LoRA update runs each layer's MLP {p.mlpChunk.toLocaleString('en-US')} tokens at a time (fewer, taller
              GPU passes than {DEFAULT_MLP_CHUNK}),{' '}
              {budget ? 'within your GPU memory' : 'in memory the round needs anyway'}.
            </p>
          ) : null}
          {!check.problem ? (
            <p className="muted" data-testid="prefill-chunk">
              Prompts are prefilled {p.forwardChunk.toLocaleString('en-US')} tokens at a time
              {p.forwardChunk > FORWARD_CHUNK
                ? ': the most that adds no memory at the round’s peak (fewer, taller GPU passes)'
                : ''}
              .
            </p>
          ) : null}
        </>
      ) : (
        <p className="muted">
          {probe?.available === false
            ? `No GPU adapter: ${probe.reason}`
            : "The memory estimate appears once the model's config.json is known (Hub repos: when you leave the field)."}
        </p>
      )}
      <label className="inline">
        Your GPU memory (GiB, optional){' '}
        <input
          className="num"
          inputMode="decimal"
          value={budget}
          onChange={(e) => setBudget(e.target.value)}
          aria-label="GPU memory in GiB"
        />
      </label>
    </div>
  );
}

function LoadProgressView() {
  const progress = useApp((s) => s.loadProgress);
  const downloads = useApp((s) => s.downloads);
  // The per-file table outlives the load (until the next one starts): what was fetched, how
  // big and how fast stays readable after a download too quick to watch.
  const files = Object.values(downloads);
  if (!progress && files.length === 0) return null;
  return (
    <div className="progress-block">
      {progress && (
        <div className="progress">
          <progress
            max={1}
            value={progress.stage === 'upload' || progress.stage === 'cache' ? progress.fraction : undefined}
            aria-label="Loading progress"
          />
          <span>{progress.text}</span>
        </div>
      )}
      {files.length > 0 && (
        <table className="downloads" aria-label="Downloads">
          <tbody>
            {files.map((d) => (
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
                <td>
                  {d.total && d.loaded >= d.total
                    ? 'done'
                    : Number.isFinite(d.etaSeconds)
                      ? `${Math.ceil(d.etaSeconds)} s left`
                      : ''}
                </td>
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
  if (cached.length === 0)
    return (
      <p className="muted small">No models cached in this browser yet (Hub downloads are kept for the next visit).</p>
    );
  return (
    <table className="cached" aria-label="Cached models">
      <tbody>
        {cached.map((m) => (
          <tr key={`${m.repo}@${m.revision}+${m.format}`}>
            <td title={m.revision}>
              {m.repo}
              {m.branches.length > 0 ? ` @${m.branches.join(', ')}` : ''}
              {/^[0-9a-f]{40}$/.test(m.revision)
                ? ` (commit ${m.revision.slice(0, 7)})`
                : m.revision !== 'main'
                  ? `@${m.revision}`
                  : ''}
            </td>
            <td>
              {CACHE_FORMAT_LABEL[m.format]}
              {m.complete ? '' : ' (incomplete)'}
            </td>
            <td>{formatBytes(m.bytes)}</td>
            <td>
              <button
                className="link"
                onClick={() => del(m.repo, m.revision, m.format)}
                aria-label={`Delete ${m.repo} from the cache (${CACHE_FORMAT_LABEL[m.format]}), commit ${m.revision.slice(0, 7)}`}
              >
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
      <FormatChoice />
      {/* The Load row comes before the memory plan: the plan appears (and grows) when the model's
          config.json is read, which happens as the repo field is left, often by the very click
          that presses Load; above the button it would move the button under that click. */}
      <div className="row">
        <button
          onClick={() => load()}
          disabled={loading || running || blocked || (option === 'hub' && !customRepo.trim())}
        >
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
          Loaded <strong>{model.name}</strong>: <strong>{model.cfg.numLayers}-layer Qwen3</strong> (hidden{' '}
          {model.cfg.hiddenSize}, {model.cfg.numHeads} heads / {model.cfg.numKvHeads} KV, vocab{' '}
          {model.cfg.vocabSize.toLocaleString('en-US')}) on <strong>{model.gpu.description}</strong>
          {model.gpu.f16 ? ', shader-f16' : ''}
          {model.gpu.subgroups ? ', subgroups' : ''}.
        </p>
      )}
      {model && !loading && (
        <p data-testid="model-format" className="small">
          Weights <strong>{model.format.weights}</strong> (
          {formatBytes(weightBytes(model.cfg, model.format.weights).total)}), KV cache{' '}
          <strong>{model.format.kv}</strong>
          {model.quantizedCache?.status === 'hit' && (
            <>; read from the q4 cache ({formatBytes(model.quantizedCache.bytes)}), nothing downloaded or quantized</>
          )}
          {model.quantizedCache?.status === 'stored' && (
            <>; the q4 weights are cached ({formatBytes(model.quantizedCache.bytes)}) for the next load</>
          )}
          {model.quantizedCache?.status === 'not-stored' && (
            <>; the q4 weights could not be cached: {model.quantizedCache.error}</>
          )}
          {formatTuning(model.kernels) && (
            <>
              ; kernel variants <strong data-testid="model-kernels">{formatTuning(model.kernels)}</strong>
            </>
          )}
          .
        </p>
      )}
      {error && (
        <p role="alert" className="error">
          {error}
        </p>
      )}
      <MemoryCheck />
      <details>
        <summary>Cached models</summary>
        <CachedModels />
      </details>
    </section>
  );
}
