// Every prompt the agents read, built from the texts in PromptConfig (the one place the
// instructions live). Prompts are rendered with the checkpoint's chat template and tokenized
// here, so the engine receives token ids plus which prompts share a KV-cache prefix.
import type { ChatMessage } from '../model/tokenizer.ts';
import { playerName, seatsByLabel, type Roles } from './roles.ts';
import { commonPrefixLength, type GameTokenizer } from './text.ts';

export interface PromptConfig {
  /** The performing-stage instruction; it follows the report. */
  summaryInstruction: string;
  /** The voting-stage rules; they follow the voter's copy of the report, and the summaries follow them. */
  voteInstruction: string;
  /** The last line of a vote prompt; {self} becomes the voter's own label ("Player 3"). */
  voteQuestion: string;
  /** Replaces voteQuestion when votes are preceded by a free-text reason. */
  reasonQuestion: string;
  /** Qwen3's hybrid thinking; false renders the empty <think></think> block so answers start at once. */
  enableThinking: boolean;
}

export const DEFAULT_PROMPTS: PromptConfig = {
  summaryInstruction: 'Summarize the report above in one paragraph. Cover all of its main points.',
  voteInstruction:
    'We are playing "Who Is the Spy?". Every player summarized the report above. All players were given the full report ' +
    'except one, the spy, whose copy had a passage removed without notice. Compare each summary with the report and find ' +
    'the player whose summary leaves out part of the report.',
  voteQuestion: 'You are {self}. Which other player is the spy? Answer in the form "Player <number>".',
  reasonQuestion:
    'You are {self}. Which other player is the spy? Give your reason in one sentence, then answer on a new line in the form "Vote: Player <number>".',
  enableThinking: false,
};

/** The vote answer is prefilled up to the label's number, so one next token names the suspect. */
export const VOTE_ANSWER_PREFIX = 'Player ';
/** Appended after a free-text reason, before the prefilled answer. */
export const REASON_VOTE_SEPARATOR = '\nVote: ';

export interface ChatPrompt {
  messages: ChatMessage[];
  /** Text after the rendered generation prompt: the start of the assistant's answer ('' for summaries). */
  prefill: string;
  /** Rendered chat template + prefill: exactly what the model reads. */
  text: string;
  tokenIds: number[];
  /** The first `tokens` ids equal those of prompts[source] in the same batch: prefill once, share its KV cache. */
  kvShare: { source: number; tokens: number } | null;
}

/**
 * Messages and prefill carry untrusted text (documents, other players' summaries and reasons):
 * encodeChat keeps special-token matching off for them, so only the chat template's own markers
 * are control tokens and a summary cannot close the voter's turn by writing "<|im_end|>".
 */
export function renderPrompt(
  tokenizer: GameTokenizer,
  messages: ChatMessage[],
  prefill: string,
  cfg: Pick<PromptConfig, 'enableThinking'>,
): ChatPrompt {
  const { text, tokenIds } = tokenizer.encodeChat(
    messages,
    { addGenerationPrompt: true, enableThinking: cfg.enableThinking },
    prefill,
  );
  return { messages, prefill, text, tokenIds, kvShare: null };
}

/** Marks every prompt after `source` with the prefix it shares with prompts[source]. */
export function shareKvPrefix(prompts: ChatPrompt[], source: number): ChatPrompt[] {
  const src = prompts[source]!;
  return prompts.map((p, i) =>
    i === source ? p : { ...p, kvShare: { source, tokens: commonPrefixLength(src.tokenIds, p.tokenIds) } },
  );
}

/**
 * Every prompt of a round opens with the player's copy of the report, as its own head (the
 * report first, the instructions after it, as long-document prompts usually are): a player's
 * vote (and reason) prompt then begins with the same tokens as its summary prompt, so GpuPolicy
 * takes the report's KV-cache pages from the summaries' prefill instead of prefilling the report
 * again (GenerateOptions.keepPromptKv), and the update's prefix tree packs a player's summary
 * and vote on one copy of it.
 */
export function reportHead(report: string): string {
  return `Report:\n${report}\n\n`;
}

export function summaryMessages(report: string, cfg: PromptConfig): ChatMessage[] {
  return [{ role: 'user', content: `${reportHead(report)}${cfg.summaryInstruction}` }];
}

export interface SummaryPrompts {
  /** One per seat; civilians' prompts are identical. */
  prompts: ChatPrompt[];
  /** Tokens the spy's prompt shares with the civilians' (up to the removed span). */
  sharedPrefixTokens: number;
}

export function summaryPrompts(
  tokenizer: GameTokenizer,
  roles: Roles,
  civilianText: string,
  spyText: string,
  cfg: PromptConfig,
): SummaryPrompts {
  const civilian = renderPrompt(tokenizer, summaryMessages(civilianText, cfg), '', cfg);
  const spy = renderPrompt(tokenizer, summaryMessages(spyText, cfg), '', cfg);
  const firstCivilian = roles.spySeat === 0 ? 1 : 0;
  const prompts = shareKvPrefix(
    Array.from({ length: roles.groupSize }, (_, seat) => (seat === roles.spySeat ? spy : civilian)),
    firstCivilian,
  );
  return { prompts, sharedPrefixTokens: commonPrefixLength(civilian.tokenIds, spy.tokenIds) };
}

/** A summary as listed to voters: trimmed, and visibly empty when it is. */
function listedSummary(text: string): string {
  const t = text.trim();
  return t === '' ? '(no summary)' : t;
}

export function voteMessages(
  report: string,
  summaries: readonly string[],
  roles: Roles,
  voterSeat: number,
  question: string,
  cfg: PromptConfig,
): ChatMessage[] {
  const listed = seatsByLabel(roles)
    .map((seat) => `${playerName(roles.labels[seat]!)}: ${listedSummary(summaries[seat] ?? '')}`)
    .join('\n\n');
  const ask = question.replaceAll('{self}', playerName(roles.labels[voterSeat]!));
  // The report first (reportHead: the summary prompt's opening); the voter-specific line last, so
  // civilians' vote prompts share everything before it.
  return [{ role: 'user', content: `${reportHead(report)}${cfg.voteInstruction}\n\nSummaries:\n${listed}\n\n${ask}` }];
}

export interface VotePromptInput {
  roles: Roles;
  civilianText: string;
  spyText: string;
  /** Per seat. */
  summaries: readonly string[];
  /** Per seat, when votes are preceded by a generated reason; null otherwise. */
  reasons?: readonly string[] | null;
}

/** The prompts that ask each seat for a free-text reason (voteReason mode). */
export function reasonPrompts(
  tokenizer: GameTokenizer,
  input: Omit<VotePromptInput, 'reasons'>,
  cfg: PromptConfig,
): ChatPrompt[] {
  const { roles } = input;
  const prompts = Array.from({ length: roles.groupSize }, (_, seat) =>
    renderPrompt(
      tokenizer,
      voteMessages(
        seat === roles.spySeat ? input.spyText : input.civilianText,
        input.summaries,
        roles,
        seat,
        cfg.reasonQuestion,
        cfg,
      ),
      '',
      cfg,
    ),
  );
  return shareKvPrefix(prompts, roles.spySeat === 0 ? 1 : 0);
}

/** A generated reason, cut before any vote the model wrote itself, on one line. */
export function cleanReason(text: string): string {
  const cut = text.search(/vote\s*:/i);
  return (cut >= 0 ? text.slice(0, cut) : text).replace(/\s+/g, ' ').trim();
}

/** One prompt per seat ending in "Player ", so the next token is the suspect's number. */
export function votePrompts(tokenizer: GameTokenizer, input: VotePromptInput, cfg: PromptConfig): ChatPrompt[] {
  const { roles, reasons } = input;
  const prompts = Array.from({ length: roles.groupSize }, (_, seat) => {
    const report = seat === roles.spySeat ? input.spyText : input.civilianText;
    const question = reasons ? cfg.reasonQuestion : cfg.voteQuestion;
    const prefill = reasons
      ? `${cleanReason(reasons[seat] ?? '')}${REASON_VOTE_SEPARATOR}${VOTE_ANSWER_PREFIX}`
      : VOTE_ANSWER_PREFIX;
    return renderPrompt(tokenizer, voteMessages(report, input.summaries, roles, seat, question, cfg), prefill, cfg);
  });
  return shareKvPrefix(prompts, roles.spySeat === 0 ? 1 : 0);
}

/**
 * labelTokens[k - 1] = the one token that follows VOTE_ANSWER_PREFIX for "Player k".
 * Throws when a label is not exactly one token after the prefix (the vote would not be one
 * next-token choice).
 */
export function labelTokenIds(tokenizer: GameTokenizer, maxLabel: number): number[] {
  const prefix = tokenizer.encode(VOTE_ANSWER_PREFIX);
  const out: number[] = [];
  for (let k = 1; k <= maxLabel; k++) {
    const ids = tokenizer.encode(`${VOTE_ANSWER_PREFIX}${k}`);
    if (ids.length !== prefix.length + 1 || commonPrefixLength(ids, prefix) !== prefix.length) {
      throw new RangeError(
        `"${VOTE_ANSWER_PREFIX}${k}" does not tokenize as "${VOTE_ANSWER_PREFIX}" plus one token (${JSON.stringify(ids)}): votes need one token per label`,
      );
    }
    out.push(ids[ids.length - 1]!);
  }
  if (new Set(out).size !== out.length) throw new RangeError(`labels share a token: ${JSON.stringify(out)}`);
  return out;
}
