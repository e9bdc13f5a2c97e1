// Qwen3 tokenizer: @huggingface/tokenizers for BPE, @huggingface/jinja for the chat template,
// both driven by the checkpoint's own tokenizer.json / tokenizer_config.json.
import { Tokenizer } from '@huggingface/tokenizers';
import { Template } from '@huggingface/jinja';
import { ModelLoadError } from './errors.ts';
import { readJson, type ModelSource } from './sources.ts';

export const IM_START = 151644; // <|im_start|>
export const IM_END = 151645; // <|im_end|>
export const END_OF_TEXT = 151643; // <|endoftext|>
const DEFAULT_STOP_IDS = [IM_END, END_OF_TEXT];

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

  constructor(files: TokenizerFiles) {
    const { tokenizerJson, tokenizerConfig } = files;
    if (!isRecord(tokenizerJson) || !isRecord(tokenizerJson['model'])) throw new ModelLoadError('tokenizer.json', 'missing "model" object');
    if (!isRecord(tokenizerConfig)) throw new ModelLoadError('tokenizer_config.json', 'is not a JSON object');
    try {
      this.tokenizer = new Tokenizer(tokenizerJson, tokenizerConfig);
    } catch (e) {
      throw new ModelLoadError('tokenizer.json', `cannot build the tokenizer (${(e as Error).message})`);
    }
    this.bosToken = tokenContent(tokenizerConfig['bos_token']);
    this.eosToken = tokenContent(tokenizerConfig['eos_token']);
    this.padToken = tokenContent(tokenizerConfig['pad_token']);

    const chatTemplate = tokenizerConfig['chat_template'];
    try {
      this.template = typeof chatTemplate === 'string' ? new Template(chatTemplate) : null;
    } catch (e) {
      throw new ModelLoadError('tokenizer_config.json', `chat_template does not parse (${(e as Error).message})`);
    }

    let maxId = -1;
    for (const id of this.tokenizer.get_vocab(true).values()) maxId = Math.max(maxId, id);
    this.vocabSize = maxId + 1;

    const stop = new Set([...eosIds(files.generationConfig), ...eosIds(files.modelConfig)]);
    const eosTokenId = this.eosToken === null ? undefined : this.tokenizer.token_to_id(this.eosToken);
    if (eosTokenId !== undefined) stop.add(eosTokenId);
    this.stopIds = stop.size > 0 ? [...stop] : [...DEFAULT_STOP_IDS];
  }

  /** Token ids of `text`; special tokens written in the text (e.g. <|im_start|>) map to their ids, nothing is added. */
  encode(text: string): number[] {
    return this.tokenizer.encode(text, { add_special_tokens: false }).ids;
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
    return this.template.render(vars);
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

/** Reads tokenizer.json + tokenizer_config.json (required) and generation_config.json / config.json (optional). */
export async function loadTokenizer(source: Pick<ModelSource, 'readText' | 'exists'>): Promise<Qwen3Tokenizer> {
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
    if (!(await source.exists(f))) throw new ModelLoadError(f, 'not found: the checkpoint needs its tokenizer files');
  }
  const optional = async (f: string) => ((await source.exists(f)) ? readJson(source, f) : undefined);
  return new Qwen3Tokenizer({
    tokenizerJson: await readJson(source, 'tokenizer.json'),
    tokenizerConfig: await readJson(source, 'tokenizer_config.json'),
    generationConfig: await optional('generation_config.json'),
    modelConfig: await optional('config.json'),
  });
}
