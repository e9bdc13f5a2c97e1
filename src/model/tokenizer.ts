// Qwen3 tokenizer: @huggingface/tokenizers for BPE, @huggingface/jinja for the chat template,
// both driven by the checkpoint's own tokenizer.json / tokenizer_config.json.
import { Tokenizer } from '@huggingface/tokenizers';
import { Template } from '@huggingface/jinja';
import { ModelLoadError } from './errors.ts';
import type { ModelSource } from './sources.ts';

export const IM_START = 151644; // <|im_start|>
export const IM_END = 151645; // <|im_end|>
export const END_OF_TEXT = 151643; // <|endoftext|>
const DEFAULT_STOP_IDS = [IM_END, END_OF_TEXT];

/**
 * Size caps on the tokenizer files, checked before parsing: Qwen3's tokenizer.json is 11 MB and
 * its chat template 4 KB, so these leave ample room while refusing a file built to exhaust memory
 * or to make every render slow. (A template or regex that still runs away is stopped by the
 * app's worker watchdog, src/worker/tokenizerWatch.ts.)
 */
export const TOKENIZER_JSON_MAX_CHARS = 64 * 1024 * 1024;
export const TOKENIZER_CONFIG_MAX_CHARS = 1024 * 1024;
export const CHAT_TEMPLATE_MAX_CHARS = 64 * 1024;

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool' | (string & {});
  content: string;
  reasoning_content?: string;
}

export interface ChatTemplateOptions {
  /** Append `<|im_start|>assistant\n` so the model answers next. Default true. */
  addGenerationPrompt?: boolean;
  /** false appends an empty `<think>\n\n</think>\n\n` (Qwen3 hybrid-thinking models); undefined leaves it to the template. */
  enableThinking?: boolean;
  tools?: unknown[];
}

/**
 * Told when a tokenizer call (building it, rendering the chat template, BPE with the file's
 * pre-tokenizer regex) starts and ends, and which file drives it. The browser worker forwards
 * this to the page, whose watchdog stops the worker when one call runs away (a regex with
 * catastrophic backtracking, a template that loops): the worker itself cannot interrupt it.
 */
export interface TokenizerWatch {
  begin(file: string): void;
  end(): void;
}

let watch: TokenizerWatch | null = null;
const watchStack: string[] = [];

export function setTokenizerWatch(w: TokenizerWatch | null): void {
  watch = w;
  watchStack.length = 0;
}

/** Runs fn with `file` reported as the file in charge; a nested call reports its own file, then the outer one again. */
function watched<T>(file: string, fn: () => T): T {
  if (!watch) return fn();
  const w = watch;
  watchStack.push(file);
  w.begin(file);
  try {
    return fn();
  } finally {
    watchStack.pop();
    const outer = watchStack[watchStack.length - 1];
    if (outer === undefined) w.end();
    else w.begin(outer);
  }
}

const TOKENIZER_FILE = 'tokenizer.json';
const TEMPLATE_FILE = 'tokenizer_config.json (chat_template)';

type Json = Record<string, unknown>;

function isRecord(x: unknown): x is Json {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

/** tokenizer_config.json stores special tokens either as strings or as AddedToken objects. */
function tokenContent(x: unknown): string | null {
  if (typeof x === 'string') return x;
  if (isRecord(x) && typeof x['content'] === 'string') return x['content'];
  return null;
}

function eosIds(json: unknown): number[] {
  const v = isRecord(json) ? json['eos_token_id'] : undefined;
  const ids = Array.isArray(v) ? v : [v];
  return ids.filter((x): x is number => typeof x === 'number' && Number.isSafeInteger(x) && x >= 0);
}

export interface TokenizerFiles {
  tokenizerJson: unknown;
  tokenizerConfig: unknown;
  /** generation_config.json, for eos_token_id. */
  generationConfig?: unknown;
  /** config.json, for eos_token_id. */
  modelConfig?: unknown;
}

export class Qwen3Tokenizer {
  /** Ids that end generation: generation_config + config eos_token_id + tokenizer_config eos_token. */
  readonly stopIds: number[];
  /** Largest id + 1, including added tokens. */
  readonly vocabSize: number;
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  private readonly tokenizer: Tokenizer;
  private readonly template: Template | null;
  private readonly padToken: string | null;
  /** Every added token (special or not): the strings the library matches in text as one id. */
  private readonly addedTokens: { id: number; content: string }[];

  constructor(files: TokenizerFiles) {
    const { tokenizerJson, tokenizerConfig } = files;
    if (!isRecord(tokenizerJson) || !isRecord(tokenizerJson['model']))
      throw new ModelLoadError('tokenizer.json', 'missing "model" object');
    if (!isRecord(tokenizerConfig)) throw new ModelLoadError('tokenizer_config.json', 'is not a JSON object');
    const chatTemplate = tokenizerConfig['chat_template'];
    if (typeof chatTemplate === 'string' && chatTemplate.length > CHAT_TEMPLATE_MAX_CHARS) {
      throw new ModelLoadError(
        'tokenizer_config.json',
        `chat_template is ${chatTemplate.length} characters; the cap is ${CHAT_TEMPLATE_MAX_CHARS} (64 KB)`,
      );
    }
    try {
      this.tokenizer = watched(TOKENIZER_FILE, () => new Tokenizer(tokenizerJson, tokenizerConfig));
    } catch (e) {
      throw new ModelLoadError('tokenizer.json', `cannot build the tokenizer (${(e as Error).message})`);
    }
    this.bosToken = tokenContent(tokenizerConfig['bos_token']);
    this.eosToken = tokenContent(tokenizerConfig['eos_token']);
    this.padToken = tokenContent(tokenizerConfig['pad_token']);

    try {
      this.template =
        typeof chatTemplate === 'string' ? watched(TEMPLATE_FILE, () => new Template(chatTemplate)) : null;
    } catch (e) {
      throw new ModelLoadError('tokenizer_config.json', `chat_template does not parse (${(e as Error).message})`);
    }

    this.addedTokens = [...this.tokenizer.get_added_tokens_decoder()]
      .map(([id, t]) => ({ id, content: t.content }))
      .filter((t) => t.content !== '');
    this.addedTokens.sort((a, b) => b.content.length - a.content.length); // longest first: leftmost-longest matching

    let maxId = -1;
    for (const id of this.tokenizer.get_vocab(true).values()) maxId = Math.max(maxId, id);
    this.vocabSize = maxId + 1;

    const stop = new Set([...eosIds(files.generationConfig), ...eosIds(files.modelConfig)]);
    const eosTokenId = this.eosToken === null ? undefined : this.tokenizer.token_to_id(this.eosToken);
    if (eosTokenId !== undefined) stop.add(eosTokenId);
    this.stopIds = stop.size > 0 ? [...stop] : [...DEFAULT_STOP_IDS];
  }

  /**
   * Token ids of trusted text: special tokens written in it (e.g. <|im_start|>) map to their ids,
   * nothing is added. Use it for template text only; untrusted text goes through encodeText.
   */
  encode(text: string): number[] {
    return watched(TOKENIZER_FILE, () => this.tokenizer.encode(text, { add_special_tokens: false }).ids);
  }

  /**
   * Token ids of untrusted text (documents, model-written summaries and reasons): special-token
   * matching off, so "<|im_end|>" written in the text is the plain characters, never id 151645.
   * Text without added-token strings encodes exactly as encode() does: this is the library's own
   * per-section pipeline (normalizer, pre-tokenizer, BPE) without the added-token split.
   */
  encodeText(text: string): number[] {
    return text === '' ? [] : watched(TOKENIZER_FILE, () => this.encodePlain(text));
  }

  private encodePlain(text: string): number[] {
    const t = this.tokenizer;
    const normalized = t.normalizer ? t.normalizer(text) : text;
    if (normalized === '') return [];
    const pieces = t.pre_tokenizer ? t.pre_tokenizer(normalized, { section_index: 0 }) : [normalized];
    const model = t.model!;
    return model(pieces).map((tok) => {
      const id = model.tokens_to_ids.get(tok) ?? model.unk_token_id;
      if (id === undefined) throw new RangeError(`token "${tok}" is not in the vocabulary`);
      return id;
    });
  }

  /**
   * Renders `messages` with the chat template, appends `prefill`, and encodes the result so that
   * only the template's own markers become control tokens: message contents and the prefill are
   * untrusted and go through encodeText. The template is rendered once with placeholder contents
   * to find where its text ends and the messages begin; each run of text between two template
   * markers is then encoded as one piece, as the library itself splits at added tokens, so a
   * prompt without special-token strings in its contents gets exactly encode(text)'s ids.
   */
  encodeChat(
    messages: readonly ChatMessage[],
    opts: ChatTemplateOptions = {},
    prefill = '',
  ): { text: string; tokenIds: number[] } {
    const text = this.applyChatTemplate(messages, opts) + prefill;
    let tag = 0;
    const sentinel = (i: number) => `\uE000spyrl-${tag}-${i}\uE001`;
    while (
      messages.some(
        (m) => m.content.includes(`\uE000spyrl-${tag}-`) || (m.reasoning_content ?? '').includes(`\uE000spyrl-${tag}-`),
      )
    )
      tag++;
    const skeleton = this.applyChatTemplate(
      messages.map((m, i) => ({ ...m, content: sentinel(i) })),
      opts,
    );
    // parts alternate template text (even index) and a message's content (odd index).
    const parts: { text: string; trusted: boolean }[] = [];
    let rest = skeleton;
    messages.forEach((m, i) => {
      const at = rest.indexOf(sentinel(i));
      if (at < 0 || rest.indexOf(sentinel(i), at + 1) >= 0) {
        throw new ModelLoadError(
          'tokenizer_config.json',
          `chat_template must write each message's content once, unchanged (message ${i} is not)`,
        );
      }
      parts.push({ text: rest.slice(0, at), trusted: true }, { text: m.content, trusted: false });
      rest = rest.slice(at + sentinel(i).length);
    });
    parts.push({ text: rest, trusted: true }, { text: prefill, trusted: false });
    if (parts.map((p) => p.text).join('') !== text) {
      throw new ModelLoadError(
        'tokenizer_config.json',
        'chat_template renders differently depending on the message contents; cannot tell its markers from the text',
      );
    }
    return { text, tokenIds: this.encodeParts(parts) };
  }

  /** Added tokens are matched in trusted parts only; every run of text between two matches is encoded as one piece. */
  private encodeParts(parts: readonly { text: string; trusted: boolean }[]): number[] {
    const ids: number[] = [];
    let pending = '';
    for (const part of parts) {
      if (!part.trusted) {
        pending += part.text;
        continue;
      }
      let from = 0;
      for (;;) {
        const hit = this.nextAddedToken(part.text, from);
        if (!hit) break;
        pending += part.text.slice(from, hit.at);
        ids.push(...this.encodeText(pending), hit.id);
        pending = '';
        from = hit.at + hit.length;
      }
      pending += part.text.slice(from);
    }
    ids.push(...this.encodeText(pending));
    return ids;
  }

  /** The leftmost added token in `text` at or after `from` (the longest one there). */
  private nextAddedToken(text: string, from: number): { at: number; id: number; length: number } | null {
    let best: { at: number; id: number; length: number } | null = null;
    for (const t of this.addedTokens) {
      const at = text.indexOf(t.content, from);
      if (at >= 0 && (best === null || at < best.at)) best = { at, id: t.id, length: t.content.length };
    }
    return best;
  }

  /** The added tokens (content and id): the strings that are control tokens when a template writes them. */
  addedTokenList(): { id: number; content: string }[] {
    return this.addedTokens.map((t) => ({ ...t }));
  }

  decode(ids: ArrayLike<number>, opts: { skipSpecial?: boolean } = {}): string {
    if (ids.length === 0) return ''; // the library rejects an empty list
    return this.tokenizer.decode(Array.from(ids), { skip_special_tokens: opts.skipSpecial ?? false });
  }

  tokenToId(token: string): number | undefined {
    return this.tokenizer.token_to_id(token);
  }

  idToToken(id: number): string | undefined {
    return this.tokenizer.id_to_token(id);
  }

  applyChatTemplate(messages: readonly ChatMessage[], opts: ChatTemplateOptions = {}): string {
    if (!this.template) throw new ModelLoadError('tokenizer_config.json', 'has no chat_template');
    const vars: Record<string, unknown> = {
      messages,
      add_generation_prompt: opts.addGenerationPrompt ?? true,
      bos_token: this.bosToken ?? '',
      eos_token: this.eosToken ?? '',
      pad_token: this.padToken ?? '',
    };
    if (opts.enableThinking !== undefined) vars['enable_thinking'] = opts.enableThinking;
    if (opts.tools !== undefined) vars['tools'] = opts.tools;
    const template = this.template;
    return watched(TEMPLATE_FILE, () => template.render(vars));
  }

  createStreamer(opts: { skipSpecial?: boolean } = {}): TextStreamer {
    return new TextStreamer(this, opts);
  }
}

/**
 * Incremental detokenizer: feed ids as they are sampled, get the newly printable text.
 * Holds text back while it ends in U+FFFD (a multi-byte character split across tokens).
 */
export class TextStreamer {
  private ids: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;

  constructor(
    private readonly tokenizer: Pick<Qwen3Tokenizer, 'decode'>,
    private readonly opts: { skipSpecial?: boolean } = {},
  ) {}

  push(ids: number | ArrayLike<number>): string {
    if (typeof ids === 'number') this.ids.push(ids);
    else for (let i = 0; i < ids.length; i++) this.ids.push(ids[i]!);
    const prefix = this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.opts);
    const text = this.tokenizer.decode(this.ids.slice(this.prefixOffset), this.opts);
    if (text.length <= prefix.length || text.endsWith('\uFFFD')) return '';
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    return text.slice(prefix.length);
  }

  /** Whatever is still held back (e.g. a truncated character at the end of generation). */
  flush(): string {
    const prefix = this.tokenizer.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.opts);
    const text = this.tokenizer.decode(this.ids.slice(this.prefixOffset), this.opts);
    this.reset();
    return text.slice(prefix.length);
  }

  reset(): void {
    this.ids = [];
    this.prefixOffset = 0;
    this.readOffset = 0;
  }
}

/** Reads a JSON file after checking its size, naming the file on failure. */
async function readCappedJson(source: Pick<ModelSource, 'readText'>, file: string, maxChars: number): Promise<unknown> {
  const text = await source.readText(file);
  if (text.length > maxChars) {
    throw new ModelLoadError(file, `is ${(text.length / 2 ** 20).toFixed(1)} MB; the cap is ${maxChars / 2 ** 20} MB`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ModelLoadError(file, `not valid JSON (${(e as Error).message})`);
  }
}

/** Reads tokenizer.json + tokenizer_config.json (required) and generation_config.json / config.json (optional). */
export async function loadTokenizer(source: Pick<ModelSource, 'readText' | 'exists'>): Promise<Qwen3Tokenizer> {
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
    if (!(await source.exists(f))) throw new ModelLoadError(f, 'not found: the checkpoint needs its tokenizer files');
  }
  const optional = async (f: string) =>
    (await source.exists(f)) ? readCappedJson(source, f, TOKENIZER_CONFIG_MAX_CHARS) : undefined;
  return new Qwen3Tokenizer({
    tokenizerJson: await readCappedJson(source, 'tokenizer.json', TOKENIZER_JSON_MAX_CHARS),
    tokenizerConfig: await readCappedJson(source, 'tokenizer_config.json', TOKENIZER_CONFIG_MAX_CHARS),
    generationConfig: await optional('generation_config.json'),
    modelConfig: await optional('config.json'),
  });
}
