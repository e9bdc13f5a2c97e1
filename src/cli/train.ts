// `spyrl grad` and `spyrl sft`: LoRA gradients and a supervised LoRA fine-tune on the same engine.
import { createHash } from 'node:crypto';
import { readFile, rename, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { ModelLoadError } from '../model/errors.ts';
import {
  bool,
  ENGINE_FLAGS,
  engineOptions,
  FORCE_FLAG,
  gpuMemoryBudget,
  int,
  mlpChunk,
  MLP_CHUNK_FLAG,
  num,
  parse,
  str,
  UsageError,
  type Flags,
} from './args.ts';
import { inputIds, openModel, requireDir } from './open.ts';
import { checkOutDir, saveFolder } from './saveFolder.ts';
import type { SftRunSettings } from '../train/checkpoint.ts';
import type { LoraConfig } from '../model/peft.ts';

export async function gradCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' },
    adapter: { type: 'string' },
    tokens: { type: 'string' },
    text: { type: 'string' },
    out: { type: 'string' },
    ...ENGINE_FLAGS,
  });
  const dir = str(f, 'model', true)!;
  const adapterDir = str(f, 'adapter', true)!;
  const file = str(f, 'out', true)!;
  if ((str(f, 'tokens') === undefined) === (f.text === undefined))
    throw new UsageError('give exactly one of --tokens or --text');
  const { gpu, model, cfg, tokenizer } = await openModel(dir, adapterDir, engineOptions(f));
  try {
    const ids = inputIds(f, tokenizer, dir, cfg.vocabSize);
    if (ids.length < 2) throw new UsageError('the loss needs at least 2 tokens (each predicts the next)');
    const [{ TrainingPass }, { crossEntropyLoss }, { writeSafetensors }, { loraPrefix }] = await Promise.all([
      import('../train/trainingPass.ts'),
      import('../train/pgLoss.ts'),
      import('../model/safetensors.ts'),
      import('../model/peft.ts'),
    ]);
    const adapter = model.lora!;
    const pass = new TrainingPass(model, adapter, ids, [...ids.slice(1), -1]);
    const { loss, dlogp } = crossEntropyLoss(await pass.forward());
    pass.backward(dlogp);
    pass.release();
    const grads = await adapter.getTensors('grads');
    const shapes = new Map(
      adapter.pairs.flatMap((p) => {
        const pre = loraPrefix(p.layer, p.target);
        return [
          [`${pre}.lora_A.weight`, [adapter.settings.r, p.K]],
          [`${pre}.lora_B.weight`, [p.N, adapter.settings.r]],
        ] as [string, number[]][];
      }),
    );
    const bytes = writeSafetensors(
      [...grads.keys()].sort().map((name) => ({
        name,
        dtype: 'F32' as const,
        shape: shapes.get(name)!,
        data: new Uint8Array(grads.get(name)!.buffer),
      })),
      { format: 'pt' },
    );
    const tmp = `${file}.partial-${process.pid}`;
    await writeFile(tmp, bytes);
    await rename(tmp, file);
    out.write(JSON.stringify({ loss }) + '\n');
  } finally {
    gpu.destroy();
  }
}

function progressBar(done: number, total: number, width = 24): string {
  const n = Math.round((done / total) * width);
  return `[${'#'.repeat(n)}${'.'.repeat(width - n)}]`;
}

function fmtTime(s: number): string {
  if (!Number.isFinite(s)) return '?';
  return s >= 3600
    ? `${Math.floor(s / 3600)}h${Math.round((s % 3600) / 60)}m`
    : s >= 60
      ? `${Math.floor(s / 60)}m${Math.round(s % 60)}s`
      : `${s.toFixed(0)}s`;
}

/** The sft run settings of a --resume folder (its trainer_state.json), read before any GPU work. */
async function savedSftRun(resumeDir: string) {
  const { parseSftExtra } = await import('../train/checkpoint.ts');
  const file = join(resumeDir, 'trainer_state.json');
  const text = await readFile(file, 'utf8').catch(() => {
    throw new ModelLoadError(file, 'not found: --resume needs a folder written by spyrl sft');
  });
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`);
  }
  const extra = (json as { extra?: unknown } | null)?.extra;
  if (typeof extra !== 'object' || extra === null || Array.isArray(extra))
    throw new ModelLoadError(file, `field "extra" must be an object, got ${JSON.stringify(extra)}`);
  return parseSftExtra(extra as Record<string, unknown>, file);
}

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

export async function sftCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f: Flags = parse(args, {
    model: { type: 'string' },
    'text-file': { type: 'string' },
    steps: { type: 'string' },
    out: { type: 'string' },
    lr: { type: 'string' },
    r: { type: 'string' },
    alpha: { type: 'string' },
    rslora: { type: 'string' },
    targets: { type: 'string' },
    'seq-len': { type: 'string' },
    batch: { type: 'string' },
    schedule: { type: 'string' },
    warmup: { type: 'string' },
    'max-grad-norm': { type: 'string' },
    'weight-decay': { type: 'string' },
    seed: { type: 'string' },
    resume: { type: 'string' },
    'gpu-memory': { type: 'string' },
    ...MLP_CHUNK_FLAG,
    ...ENGINE_FLAGS,
    ...FORCE_FLAG,
  });
  const dir = str(f, 'model', true)!;
  const resumeDir = str(f, 'resume');
  const textFile = str(f, 'text-file', !resumeDir);
  const outDir = str(f, 'out', true)!;
  const steps = int(f, 'steps', 0, 1);
  if (!str(f, 'steps')) throw new UsageError('--steps is required');
  const given = <T>(name: string, parse: () => T): T | undefined => (str(f, name) === undefined ? undefined : parse());
  const schedule = given('schedule', () => {
    const v = str(f, 'schedule');
    if (v !== 'constant' && v !== 'cosine') throw new UsageError(`--schedule must be constant or cosine (got "${v}")`);
    return v;
  });
  // What the command line asks for (undefined = not given); a resumed run must not change any of it.
  const asked: Partial<SftRunSettings> = {
    seed: given('seed', () => int(f, 'seed', 0, 0)),
    seqLen: given('seq-len', () => int(f, 'seq-len', 128, 2)),
    batch: given('batch', () => int(f, 'batch', 1, 1)),
    lr: given('lr', () => num(f, 'lr', 2e-4, { above: 0 })),
    schedule,
    warmup: given('warmup', () => int(f, 'warmup', 0, 0)),
    maxGradNorm: given('max-grad-norm', () => num(f, 'max-grad-norm', 1, { min: 0 })),
    weightDecay: given('weight-decay', () => num(f, 'weight-decay', 0, { min: 0 })),
    weights: given('weights', () => engineOptions(f).weights),
  };
  const budget = gpuMemoryBudget(f);
  const mlpRows = mlpChunk(f);
  await checkOutDir(outDir, f.force === true);
  if (resumeDir) await requireDir(resumeDir, 'resume folder');
  const saved = resumeDir ? await savedSftRun(resumeDir) : null;
  const textPath = textFile ?? saved!.textFile;

  const text = await readFile(textPath, 'utf8').catch((e: NodeJS.ErrnoException) => {
    throw new ModelLoadError(textPath, e.code === 'ENOENT' ? 'text file not found' : `cannot read: ${e.message}`);
  });
  if (!text.trim()) throw new ModelLoadError(textPath, 'is empty');
  asked.textSha256 = sha256(text);
  const { DEFAULT_ADAMW } = await import('../train/optimizer.ts');
  let run: SftRunSettings;
  if (saved) {
    const { changedSettings, SFT_SETTING_FLAGS } = await import('../train/checkpoint.ts');
    // A checkpoint from before --weights was recorded takes the flag as given.
    const changed = changedSettings(saved.settings, asked).filter(
      (k) => k !== 'weights' || saved.settings.weights !== undefined,
    );
    if (changed.length) {
      const detail = changed.map((k) =>
        k === 'textSha256'
          ? `${SFT_SETTING_FLAGS[k]} ${textPath} differs from the run's ${saved.textFile}`
          : `${SFT_SETTING_FLAGS[k]} (saved ${saved.settings[k]}, asked ${asked[k]})`,
      );
      throw new UsageError(
        `--resume: these would change the run: ${detail.join(', ')}; leave them out to continue with the saved settings`,
      );
    }
    run = { ...saved.settings, weights: saved.settings.weights ?? engineOptions(f).weights };
    if (run.scheduleSteps !== null && steps > run.scheduleSteps) {
      throw new UsageError(
        `--resume: --steps ${steps} is past the end of the run's cosine schedule (${run.scheduleSteps} steps); the learning rate is 0 there`,
      );
    }
  } else {
    const kind = asked.schedule ?? 'constant';
    run = {
      seed: asked.seed ?? 0,
      seqLen: asked.seqLen ?? 128,
      batch: asked.batch ?? 1,
      lr: asked.lr ?? 2e-4,
      schedule: kind,
      warmup: asked.warmup ?? 0,
      scheduleSteps: kind === 'cosine' ? steps : null,
      maxGradNorm: asked.maxGradNorm ?? DEFAULT_ADAMW.maxGradNorm,
      weightDecay: asked.weightDecay ?? DEFAULT_ADAMW.weightDecay,
      textSha256: asked.textSha256,
      weights: engineOptions(f).weights,
    };
  }
  const { seed, seqLen, batch, lr, warmup } = run;
  const scheduleKind = run.schedule;

  const [
    { loraConfig, initLora, readAdapter, readOptimizerState, writeAdapter, writeOptimizerState, LORA_TARGETS },
    { LoraAdapter },
    { LoraAdamW },
    { packSequences, epochOrder, sftStep },
    { planSft, checkPlanFits, withKeptLayers, DEFAULT_MLP_CHUNK },
    { nodeFolderSource },
    { runStamp },
  ] = await Promise.all([
    import('../model/peft.ts'),
    import('../model/lora.ts'),
    import('../train/optimizer.ts'),
    import('../train/sft.ts'),
    import('../train/memory.ts'),
    import('../model/sources.node.ts'),
    import('../train/checkpoint.ts'),
  ]);
  const stamp = saved?.stamp ?? runStamp();
  // A new adapter's settings are checked before the model is loaded (a resumed one's come from its files).
  let fresh: LoraConfig | undefined;
  if (!resumeDir) {
    const targets = (str(f, 'targets') ?? LORA_TARGETS.join(','))
      .split(',')
      .map((t) => t.trim())
      .filter(Boolean);
    try {
      fresh = loraConfig({
        r: int(f, 'r', 8, 1),
        alpha: num(f, 'alpha', 16),
        useRslora: bool(f, 'rslora', false),
        targetModules: targets as never,
        baseModel: dir,
      });
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
  }

  const engine = { ...engineOptions(f), weights: run.weights! };
  const { gpu, model, cfg, tokenizer } = await openModel(dir, undefined, engine);
  try {
    if (!tokenizer) throw new ModelLoadError('tokenizer.json', `not found in ${dir}: sft needs the tokenizer files`);
    let lora;
    let weights;
    if (resumeDir) {
      ({ lora, tensors: weights } = await readAdapter(nodeFolderSource(resumeDir), cfg));
      const adapterFlags: [string, unknown, unknown][] = [
        ['r', given('r', () => int(f, 'r', 8, 1)), lora.r],
        ['alpha', given('alpha', () => num(f, 'alpha', 16)), lora.alpha],
        ['rslora', given('rslora', () => bool(f, 'rslora', false)), lora.useRslora],
        [
          'targets',
          given('targets', () =>
            LORA_TARGETS.filter((t) =>
              str(f, 'targets')!
                .split(',')
                .map((x) => x.trim())
                .includes(t),
            ).join(','),
          ),
          lora.targetModules.join(','),
        ],
      ];
      const differ = adapterFlags.filter(([, want, have]) => want !== undefined && want !== have);
      if (differ.length)
        throw new UsageError(
          `--resume: these would change the run's adapter: ${differ.map(([k, want, have]) => `--${k} (saved ${have}, asked ${want})`).join(', ')}; leave them out to continue`,
        );
    } else {
      lora = fresh!;
      weights = initLora(cfg, lora, seed);
    }
    const sftPlan = planSft(cfg, {
      weights: engine.weights,
      lora: { r: lora.r, targets: lora.targetModules },
      seqLen,
      mlpChunk: mlpRows ?? 'auto',
    });
    checkPlanFits(sftPlan, gpu.limits, budget);
    // With --gpu-memory, the passes keep as many layers' activations as fit in 90% of it, then
    // (--mlp-chunk auto) take MLP chunks as tall as what is left allows.
    const { keepLayers, mlpChunk: mlpChunkRows } = withKeptLayers(sftPlan, gpu.limits, budget);

    const windows = packSequences(tokenizer.encode(text), seqLen);
    if (windows.length === 0) throw new ModelLoadError(textPath, 'has fewer than 2 tokens');
    const adapter = new LoraAdapter(gpu, cfg, lora);
    adapter.setWeights(weights);
    model.lora = adapter;
    const settings = {
      ...DEFAULT_ADAMW,
      lr,
      maxGradNorm: run.maxGradNorm,
      weightDecay: run.weightDecay,
      schedule:
        scheduleKind === 'cosine'
          ? { kind: 'cosine' as const, warmup, total: run.scheduleSteps!, minLr: 0 }
          : { kind: 'constant' as const, warmup },
    };
    const opt = new LoraAdamW(gpu, adapter, settings);
    if (resumeDir) opt.setState(await readOptimizerState(nodeFolderSource(resumeDir), weights)); // moments checked finite, v >= 0
    if (opt.step >= steps)
      throw new UsageError(`the resumed run has already taken ${opt.step} steps; ask for more than that with --steps`);

    const n = windows.length;
    const firstStep = opt.step + 1;
    const tty = (process.stderr as { isTTY?: boolean }).isTTY;
    const started = performance.now();
    let tokensSeen = 0;
    out.write(
      `sft: ${n} windows of <= ${seqLen} tokens, batch ${batch}, LoRA r=${lora.r} alpha=${lora.alpha} on ${lora.targetModules.join(',')} (${adapter.numParams.toLocaleString()} params), lr ${lr} ${scheduleKind}${keepLayers ? `; keeping ${keepLayers} of ${cfg.numLayers} layers' activations (--gpu-memory)` : ''}${mlpChunkRows !== DEFAULT_MLP_CHUNK ? `; MLP ${mlpChunkRows} rows a chunk` : ''}\n`,
    );
    for (let step = opt.step + 1; step <= steps; step++) {
      // The windows of a step follow from the step number alone, so a resumed run sees the same data.
      const picked = Array.from({ length: batch }, (_, i) => {
        const g = (step - 1) * batch + i;
        return windows[epochOrder(n, seed, Math.floor(g / n))[g % n]];
      });
      const res = await sftStep(model, adapter, opt, picked, { keepLayers, mlpChunk: mlpChunkRows });
      tokensSeen += res.tokens;
      const elapsed = (performance.now() - started) / 1000;
      const eta = (elapsed / (step - firstStep + 1)) * (steps - step);
      const line = `step ${step}/${steps}  loss ${res.loss.toFixed(4)}  grad-norm ${res.gradNorm.toPrecision(4)}  lr ${res.lr.toExponential(2)}  ${(tokensSeen / elapsed).toFixed(1)} tok/s${res.skipped ? `  SKIPPED: ${res.reason}` : ''}`;
      if (tty) process.stderr.write(`\r\x1b[2K`);
      out.write(line + '\n');
      if (tty) process.stderr.write(`${progressBar(step, steps)} ${step}/${steps} ETA ${fmtTime(eta)}`);
    }
    if (tty) process.stderr.write('\n');
    const state = await opt.getState();
    const files = {
      ...writeAdapter(lora, await adapter.getTensors('weights'), cfg),
      ...writeOptimizerState({
        step: state.step,
        m: state.m,
        v: state.v,
        extra: { run: { ...stamp }, sft: { ...run, textFile: resolve(textPath) } },
      }),
    };
    await saveFolder(outDir, files);
    out.write(`wrote ${Object.keys(files).join(', ')} to ${outDir}\n`);
  } finally {
    gpu.destroy();
  }
}
