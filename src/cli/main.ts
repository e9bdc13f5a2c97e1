// `spyrl`: the same engine as the app, from a terminal.
//   spyrl tiny-model --out DIR [...]            a random Qwen3 checkpoint in Hugging Face layout
//   spyrl quantize --model DIR --out DIR        its q4 weights as a folder that loads on its own
//   spyrl logits --model DIR (--tokens|--text)  float32 logits [T, V] for every position
//   spyrl generate --model DIR --prompt STR     streamed text
// Bad input: one line `spyrl: error: ...` on stderr, exit code 1, nothing written.
import { createWriteStream } from 'node:fs';
import { rename, rm } from 'node:fs/promises';
import { ModelLoadError } from '../model/errors.ts';
import { TUNING_CHOICES } from '../ops/tuning.ts';
import {
  bool,
  checkIds,
  ENGINE_FLAGS,
  engineOptions,
  FORCE_FLAG,
  int,
  num,
  parse,
  str,
  tokenList,
  UsageError,
} from './args.ts';
import { inputIds, modelSource, openModel } from './open.ts';

/** --kernels' switches and their values (src/ops/tuning.ts), for the help text. */
export const KERNEL_SWITCHES = Object.entries(TUNING_CHOICES)
  .map(([name, values]) => `${name} ${values.join('|')}`)
  .join(', ');

const HELP = `spyrl: Qwen3 on your GPU in our own WebGPU kernels

Usage:
  spyrl tiny-model --out DIR [--layers 2 --hidden 64 --heads 4 --kv-heads 2 --head-dim 16
                   --intermediate 128 --vocab 151936 --tied true --shards 1 --seed 0 --force]
  spyrl quantize --model DIR --out DIR [--force]   the model's q4 weights as a folder that loads on its own
                 (model.q4.safetensors, config and tokenizer; load it with --weights q4)
  spyrl logits --model DIR (--tokens 1,2,3 | --text STR) --out FILE [--adapter DIR]
  spyrl generate --model DIR (--prompt STR [--chat] | --prompt-tokens 1,2,3)
                 [--max-new-tokens 128] [--temperature X] [--top-p X] [--top-k N] [--seed N]
                 [--print-tokens] [--adapter DIR]
  spyrl grad --model DIR --adapter DIR (--tokens 1,2,3 | --text STR) --out FILE.safetensors
  spyrl sft --model DIR --text-file F --steps N --out DIR [--lr 2e-4 --r 8 --alpha 16 --rslora false
            --targets q_proj,...,down_proj --seq-len 128 --batch 1 --schedule constant|cosine --warmup 0
            --max-grad-norm 1 --weight-decay 0 --seed 0 --resume DIR --gpu-memory GIB --mlp-chunk auto|N --force]
  spyrl train --model DIR --docs FILE|bundled --rounds N --out DIR [--config FILE.json] [--seed S] [--resume DIR] [--gpu-memory GIB] [--force]
              [--prefill-chunk auto|N]   tokens per prefill chunk (auto: the largest that adds no GPU memory at the round's peak)
              [--mlp-chunk auto|N]   rows of the update's MLP chunks (auto: the largest that adds no GPU memory at the peak
                                     or fits what --gpu-memory leaves after the kept layers)
              [--report-memory]   (ends with {"peakBytes":..,"plannedBytes":..}: measured vs planned GPU memory)
  spyrl eval --model DIR [--adapter DIR] [--compare-model DIR|OWNER/NAME[@REV]] [--docs FILE|bundled] [--config FILE.json]
             [--held-out N] [--out FILE.jsonl]   ROUGE-1/2/L (stemmed) of greedy summaries of the held-out reports
  spyrl memory (--model DIR | --config config.json | --preset Qwen/Qwen3-4B-Instruct-2507) [--weights bf16|q4 --kv f32|f16
               --players 4 --doc-tokens 2048 --summary-tokens 256 --reason-tokens 0 --lora-r 16 --lora-targets q_proj,...
               --checkpoints bf16|f16|f32 --mlp-chunk auto|N --keep-layers auto|N --gpu-memory GIB --eval-docs 0
               --prefill-chunk auto|N --run-config FILE.json]
               the GPU memory plan of a round as one JSON line (bytes), without a GPU
  spyrl memory --table   the plan of the default round for every Qwen3 preset (the README table)

--out must be a new or empty folder unless --force (which replaces it once the new save is complete).
--resume continues a run with its saved settings (spyrl_config.json, documents, --weights and --kv for
train, sft flags); a flag that would change them is refused, naming it.
Sampling defaults come from the model's generation_config.json (temperature 0 = greedy).
--model (and --compare-model) take a folder or a Hugging Face Hub repo OWNER/NAME[@REVISION] (default main),
downloaded into the Hugging Face cache as huggingface_hub lays it out, and reused from it.
Every command that loads a model takes --weights bf16|q4 and --kv f32|f16 (defaults bf16, f32) and
--kernels NAME=VALUE,... to override a kernel variant's automatic choice (docs/ENGINE.md, "Kernel variants"):
  ${KERNEL_SWITCHES}; e.g. --kernels gemmF16=off.
Environment: VK_ICD_FILENAMES picks the Vulkan driver (SwiftShader is used when no GPU is found).
  HF_HUB_CACHE (else HF_HOME/hub, else ~/.cache/huggingface/hub) the cache; HF_HUB_OFFLINE=1 no network;
  HF_TOKEN (else HF_HOME/token) for gated or private repos, sent to the Hub only; HF_ENDPOINT another Hub.`;

// ---- commands -------------------------------------------------------------------------------

async function tinyModel(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    out: { type: 'string' },
    layers: { type: 'string' },
    hidden: { type: 'string' },
    heads: { type: 'string' },
    'kv-heads': { type: 'string' },
    'head-dim': { type: 'string' },
    intermediate: { type: 'string' },
    vocab: { type: 'string' },
    tied: { type: 'string' },
    shards: { type: 'string' },
    seed: { type: 'string' },
    ...FORCE_FLAG,
  });
  const dir = str(f, 'out', true)!;
  const opts = {
    layers: int(f, 'layers', 2, 1),
    hidden: int(f, 'hidden', 64, 2),
    heads: int(f, 'heads', 4, 1),
    kvHeads: int(f, 'kv-heads', 2, 1),
    headDim: int(f, 'head-dim', 16, 2),
    intermediate: int(f, 'intermediate', 128, 2),
    vocab: int(f, 'vocab', 151936, 2),
    tied: bool(f, 'tied', true),
    shards: int(f, 'shards', 1, 1),
    seed: int(f, 'seed', 0, 0),
  };
  if (opts.heads % opts.kvHeads !== 0)
    throw new UsageError(`--heads (${opts.heads}) must be a multiple of --kv-heads (${opts.kvHeads})`);
  for (const [k, v] of [
    ['hidden', opts.hidden],
    ['head-dim', opts.headDim],
    ['intermediate', opts.intermediate],
  ] as const) {
    if (v % 2 !== 0) throw new UsageError(`--${k} must be even (bf16 weights are packed in pairs)`);
  }
  const { checkOutDir, saveFolder } = await import('./saveFolder.ts');
  await checkOutDir(dir, f.force === true);
  const [{ makeTinyCheckpoint }, { qwen3TokenizerFiles }] = await Promise.all([
    import('../model/tinyModel.ts'),
    import('../model/tinyModel.node.ts'),
  ]);
  const ckpt = makeTinyCheckpoint({ ...(await qwen3TokenizerFiles()), ...opts });
  // The whole folder is replaced (never merged): an old shard index cannot outlive a --force.
  await saveFolder(dir, Object.fromEntries(ckpt.files));
  out.write(JSON.stringify({ out: dir, files: [...ckpt.files.keys()] }) + '\n');
}

async function logits(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' },
    tokens: { type: 'string' },
    text: { type: 'string' },
    out: { type: 'string' },
    adapter: { type: 'string' },
    ...ENGINE_FLAGS,
  });
  const dir = str(f, 'model', true)!;
  const file = str(f, 'out', true)!;
  if ((str(f, 'tokens') === undefined) === (f.text === undefined))
    throw new UsageError('give exactly one of --tokens or --text');
  const { gpu, model, cfg, tokenizer } = await openModel(dir, str(f, 'adapter'), engineOptions(f));
  try {
    const ids = inputIds(f, tokenizer, dir, cfg.vocabSize);
    const T = ids.length,
      V = cfg.vocabSize;
    const cache = model.createCache(1, T);
    const tmp = `${file}.partial-${process.pid}`;
    const sink = createWriteStream(tmp);
    const sinkDone = new Promise<void>((res, rej) => {
      sink.on('finish', res);
      sink.on('error', rej);
    });
    try {
      // Streams the logits out chunk by chunk: [T, V] f32 never has to fit in memory at once.
      const step = Math.max(1, Math.min(model.chunk, Math.floor((64 << 20) / (V * 4))));
      for (let t0 = 0; t0 < T; t0 += step) {
        const n = Math.min(step, T - t0);
        const rows = Array.from({ length: n }, (_, i) => i);
        const buf = model.forward(
          { ids: ids.slice(t0, t0 + n), slots: rows.map(() => 0), positions: rows.map((i) => t0 + i), logitRows: rows },
          cache,
        );
        const bytes = await gpu.read(buf, n * V * 4);
        gpu.releaseBuffer(buf);
        if (!sink.write(new Uint8Array(bytes))) await new Promise<void>((r) => sink.once('drain', () => r()));
      }
      sink.end();
      await sinkDone;
      await rename(tmp, file);
    } catch (e) {
      sink.destroy();
      await rm(tmp, { force: true });
      throw e;
    } finally {
      cache.destroy();
    }
    out.write(JSON.stringify({ tokens: ids, shape: [T, V] }) + '\n');
  } finally {
    gpu.destroy();
  }
}

async function generateCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, {
    model: { type: 'string' },
    prompt: { type: 'string' },
    'prompt-tokens': { type: 'string' },
    chat: { type: 'boolean' },
    'max-new-tokens': { type: 'string' },
    temperature: { type: 'string' },
    'top-p': { type: 'string' },
    'top-k': { type: 'string' },
    seed: { type: 'string' },
    'print-tokens': { type: 'boolean' },
    adapter: { type: 'string' },
    ...ENGINE_FLAGS,
  });
  const dir = str(f, 'model', true)!;
  const prompt = f.prompt === undefined ? undefined : String(f.prompt);
  const promptTokens = str(f, 'prompt-tokens');
  if ((prompt === undefined) === (promptTokens === undefined))
    throw new UsageError('give exactly one of --prompt or --prompt-tokens');
  if (f.chat && prompt === undefined) throw new UsageError('--chat needs --prompt');
  const maxNewTokens = int(f, 'max-new-tokens', 128, 1);
  const source = await modelSource(dir);
  const { generate, validateSampling, samplingDefaults } = await import('../model/generate.ts');
  const defaults = await samplingDefaults(source);
  const sampling = {
    temperature: num(f, 'temperature', defaults.temperature),
    topP: num(f, 'top-p', defaults.topP),
    topK: int(f, 'top-k', defaults.topK, 0),
    seed: int(f, 'seed', 0, 0),
  };
  try {
    validateSampling(sampling);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }

  const { gpu, model, cfg, tokenizer } = await openModel(source, str(f, 'adapter'), engineOptions(f));
  try {
    let ids: number[];
    if (promptTokens !== undefined) ids = tokenList(promptTokens, 'prompt-tokens');
    else {
      if (!tokenizer)
        throw new ModelLoadError(
          'tokenizer.json',
          `not found in ${dir}: --prompt needs the tokenizer files (or use --prompt-tokens)`,
        );
      const text = f.chat
        ? tokenizer.applyChatTemplate([{ role: 'user', content: prompt! }], { addGenerationPrompt: true })
        : prompt!;
      ids = tokenizer.encode(text);
      if (ids.length === 0) throw new UsageError('--prompt encodes to no tokens');
    }
    checkIds(ids, cfg.vocabSize);
    const stopIds = tokenizer?.stopIds ?? cfg.eosTokenIds;
    const { TextStreamer } = await import('../model/tokenizer.ts');
    const streamer = tokenizer ? new TextStreamer(tokenizer, { skipSpecial: true }) : null;
    const generated: number[] = [];
    const started = performance.now();
    let firstAt = 0;
    for await (const step of generate(model, [ids], { ...sampling, maxNewTokens, stopIds })) {
      const tok = step[0];
      if (!firstAt) firstAt = performance.now();
      generated.push(tok.id);
      if (streamer && !f['print-tokens'] && !(tok.reason === 'stop')) out.write(streamer.push(tok.id));
    }
    if (f['print-tokens']) out.write(JSON.stringify({ prompt: ids, tokens: generated }) + '\n');
    else {
      if (streamer) out.write(streamer.flush());
      out.write('\n');
      const decodeS = (performance.now() - firstAt) / 1000;
      process.stderr.write(
        `[${ids.length} prompt tokens, ${generated.length} generated; prefill+first token ${((firstAt - started) / 1000).toFixed(2)} s, decode ${generated.length > 1 ? ((generated.length - 1) / decodeS).toFixed(2) : '-'} tok/s on ${gpu.info.description || gpu.info.architecture || 'GPU'}]\n`,
      );
    }
  } finally {
    gpu.destroy();
  }
}

/**
 * The q4 weights of a model (quantized on the GPU as `--weights q4` does) written as a folder that
 * loads on its own: model.q4.safetensors (src/model/q4Store.ts) beside the checkpoint's config,
 * sampling defaults and tokenizer. Loading it reads about 0.28 of the bf16 bytes and quantizes
 * nothing; the logits are bit-identical to `--weights q4` on the original.
 */
async function quantizeCmd(args: string[], out: NodeJS.WritableStream): Promise<void> {
  const f = parse(args, { model: { type: 'string' }, out: { type: 'string' }, ...ENGINE_FLAGS, ...FORCE_FLAG });
  if (str(f, 'weights') !== undefined && str(f, 'weights') !== 'q4')
    throw new UsageError(`--weights: quantize writes q4 weights (got "${str(f, 'weights')}")`);
  const spec = str(f, 'model', true)!;
  const dir = str(f, 'out', true)!;
  const [{ checkOutDir, saveFolder }, { resolve, sep }, { stat }] = await Promise.all([
    import('./saveFolder.ts'),
    import('node:path'),
    import('node:fs/promises'),
  ]);
  // --force replaces --out whole: never the model folder, nor a folder holding it.
  if (await stat(spec).catch(() => null)) {
    const [m, o] = [resolve(spec), resolve(dir)];
    if (m === o || m.startsWith(o + sep))
      throw new UsageError(`--out ${dir} is the model folder or holds it: choose a new folder`);
  }
  await checkOutDir(dir, f.force === true);
  const source = await modelSource(spec);
  const started = performance.now();
  const { gpu, model } = await openModel(source, undefined, { ...engineOptions(f), weights: 'q4' });
  try {
    const { Q4_SIDE_FILES, Q4_STORE_FILE, q4SafetensorsFile } = await import('../model/q4Store.ts');
    const files: Record<string, Uint8Array | AsyncIterable<Uint8Array>> = {};
    for (const name of Q4_SIDE_FILES) {
      if (!(await source.exists(name))) continue;
      const file = await source.open(name);
      files[name] = await file.read(0, file.size);
    }
    let bytes = 0;
    files[Q4_STORE_FILE] = (async function* () {
      for await (const piece of q4SafetensorsFile(gpu, model)) {
        bytes += piece.byteLength;
        yield piece;
      }
    })();
    await saveFolder(dir, files);
    const seconds = Math.round((performance.now() - started) / 10) / 100;
    out.write(JSON.stringify({ out: dir, files: Object.keys(files), storeBytes: bytes, seconds }) + '\n');
  } finally {
    gpu.destroy();
  }
}

// ---- entry ------------------------------------------------------------------------------------

const COMMANDS: Record<string, (args: string[], out: NodeJS.WritableStream) => Promise<void>> = {
  'tiny-model': tinyModel,
  quantize: quantizeCmd,
  logits,
  generate: generateCmd,
  grad: (args, out) => import('./train.ts').then((m) => m.gradCmd(args, out)),
  sft: (args, out) => import('./train.ts').then((m) => m.sftCmd(args, out)),
  train: (args, out) => import('./spyrl.ts').then((m) => m.trainCmd(args, out)),
  eval: (args, out) => import('./eval.ts').then((m) => m.evalCmd(args, out)),
  memory: (args, out) => import('./memory.ts').then((m) => m.memoryCmd(args, out)),
};

/** Runs one command; returns the process exit code. Errors become one line on stderr. */
export async function main(
  argv: string[],
  out: NodeJS.WritableStream = process.stdout,
  err: NodeJS.WritableStream = process.stderr,
): Promise<number> {
  const [cmd, ...args] = argv;
  if (!cmd || cmd === '--help' || cmd === '-h' || cmd === 'help') {
    out.write(HELP + '\n');
    return cmd ? 0 : 1;
  }
  const run = COMMANDS[cmd];
  if (!run) {
    err.write(
      `spyrl: error: unknown command "${cmd}" (commands: ${Object.keys(COMMANDS).join(', ')}; see spyrl --help)\n`,
    );
    return 2;
  }
  try {
    await run(args, out);
    return 0;
  } catch (e) {
    const error = e as Error;
    err.write(`spyrl: error: ${error.message}\n`);
    if (process.env.SPYRL_DEBUG) err.write(`${error.stack}\n`);
    return e instanceof UsageError ? 2 : 1;
  }
}
