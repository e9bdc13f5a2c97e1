import { beforeAll, describe, expect, it } from 'vitest';
import {
  DEFAULT_PROMPTS,
  cleanReason,
  labelTokenIds,
  reasonPrompts,
  summaryPrompts,
  votePrompts,
  VOTE_ANSWER_PREFIX,
} from '../../src/game/prompts.ts';
import { Rng } from '../../src/game/rng.ts';
import { assignRoles, seatsByLabel, MAX_GROUP_SIZE } from '../../src/game/roles.ts';
import { commonPrefixLength } from '../../src/game/text.ts';
import type { Qwen3Tokenizer } from '../../src/model/tokenizer.ts';
import { listedSummaries, qwen3Tokenizer } from '../helpers/game.ts';

let tok: Qwen3Tokenizer;
beforeAll(async () => {
  tok = await qwen3Tokenizer();
});

const FULL = 'The agency spent $2 billion. It hired 300 staff. Audits found gaps. The plan ends in 2030.';
const SPY = 'The agency spent $2 billion. Audits found gaps. The plan ends in 2030.';

describe('roles', () => {
  it('seats one spy and shuffles labels 1..N, seeded', () => {
    for (let n = 3; n <= MAX_GROUP_SIZE; n++) {
      const r = assignRoles(n, Rng.fromSeed(n));
      expect([...r.labels].sort()).toEqual(Array.from({ length: n }, (_, i) => i + 1));
      expect(r.spySeat >= 0 && r.spySeat < n).toBe(true);
      expect(assignRoles(n, Rng.fromSeed(n))).toEqual(r);
    }
    const spies = new Set(Array.from({ length: 40 }, (_, s) => assignRoles(4, Rng.fromSeed(s)).spySeat));
    expect(spies.size).toBe(4);
    expect(() => assignRoles(2, Rng.fromSeed(0))).toThrow(/3\.\.8/);
    expect(() => assignRoles(9, Rng.fromSeed(0))).toThrow(/3\.\.8/);
  });
});

describe('vote labels', () => {
  it('"1".."8" are each one Qwen3 token after "Player "', () => {
    const ids = labelTokenIds(tok, 8);
    expect(ids.map((id) => tok.decode([id]))).toEqual(['1', '2', '3', '4', '5', '6', '7', '8']);
    const prefix = tok.encode(VOTE_ANSWER_PREFIX);
    for (let k = 1; k <= 8; k++) expect(tok.encode(`Player ${k}`)).toEqual([...prefix, ids[k - 1]!]);
  });

  it('in a rendered vote prompt, appending the digit appends exactly its label token', () => {
    const roles = assignRoles(8, Rng.fromSeed(5));
    const prompts = votePrompts(
      tok,
      { roles, civilianText: FULL, spyText: SPY, summaries: roles.labels.map((l) => `Summary by ${l}.`) },
      DEFAULT_PROMPTS,
    );
    const ids = labelTokenIds(tok, 8);
    for (const p of prompts) {
      expect(p.text.endsWith('<think>\n\n</think>\n\nPlayer ')).toBe(true);
      for (let k = 1; k <= 8; k++) expect(tok.encode(p.text + String(k))).toEqual([...p.tokenIds, ids[k - 1]!]);
    }
  });
});

describe('summary prompts', () => {
  it('civilians share one prompt; the spy shares its prefix up to the removed span', () => {
    const roles = assignRoles(4, Rng.fromSeed(1));
    const { prompts, sharedPrefixTokens } = summaryPrompts(tok, roles, FULL, SPY, DEFAULT_PROMPTS);
    const civ = prompts.filter((_, s) => s !== roles.spySeat);
    const spy = prompts[roles.spySeat]!;
    for (const p of civ) expect(p.text).toBe(civ[0]!.text);
    expect(spy.text).not.toBe(civ[0]!.text);
    expect(sharedPrefixTokens).toBe(commonPrefixLength(spy.tokenIds, civ[0]!.tokenIds));
    // Shared: template + "Report:" + "The agency spent $2 billion."; the next sentence differs.
    const sharedText = tok.decode(spy.tokenIds.slice(0, sharedPrefixTokens));
    expect(sharedText.endsWith('The agency spent $2 billion.')).toBe(true);
    const source = roles.spySeat === 0 ? 1 : 0;
    prompts.forEach((p, s) => {
      if (s === source) expect(p.kvShare).toBeNull();
      else expect(p.kvShare).toEqual({ source, tokens: s === roles.spySeat ? sharedPrefixTokens : p.tokenIds.length });
    });
    // The report first, the instruction after it (reportHead).
    expect(civ[0]!.text).toContain(
      `<|im_start|>user\nReport:\n${FULL}\n\n${DEFAULT_PROMPTS.summaryInstruction}<|im_end|>`,
    );
  });
});

describe('vote prompts', () => {
  it('each voter sees its own copy, all summaries in label order, and its own label last', () => {
    const roles = assignRoles(5, Rng.fromSeed(2));
    const summaries = roles.labels.map((l, seat) => (seat === 3 ? '  ' : `I am seat ${seat}, label ${l}.`));
    const prompts = votePrompts(tok, { roles, civilianText: FULL, spyText: SPY, summaries }, DEFAULT_PROMPTS);
    prompts.forEach((p, seat) => {
      const content = p.messages[0]!.content;
      // The report first, as the voter's summary prompt opened (reportHead), then the rules.
      expect(
        content.startsWith(
          `Report:\n${seat === roles.spySeat ? SPY : FULL}\n\n${DEFAULT_PROMPTS.voteInstruction}\n\nSummaries:`,
        ),
      ).toBe(true);
      const listed = listedSummaries(content);
      expect([...listed.keys()]).toEqual([1, 2, 3, 4, 5]);
      for (const s of seatsByLabel(roles))
        expect(listed.get(roles.labels[s]!)).toBe(
          s === 3 ? '(no summary)' : `I am seat ${s}, label ${roles.labels[s]}.`,
        );
      expect(
        content.endsWith(
          `You are Player ${roles.labels[seat]}. Which other player is the spy? Answer in the form "Player <number>".`,
        ),
      ).toBe(true);
      expect(p.prefill).toBe('Player ');
    });
  });

  it('with reasons, the vote prompt continues the reason prompt', () => {
    const roles = assignRoles(3, Rng.fromSeed(4));
    const input = { roles, civilianText: FULL, spyText: SPY, summaries: ['a', 'b', 'c'] };
    const rp = reasonPrompts(tok, input, DEFAULT_PROMPTS);
    const vp = votePrompts(tok, { ...input, reasons: ['Seems short.\nVote: Player 2', 'x', ''] }, DEFAULT_PROMPTS);
    expect(vp[0]!.text).toBe(`${rp[0]!.text}Seems short.\nVote: Player `);
    expect(vp[2]!.text).toBe(`${rp[2]!.text}\nVote: Player `);
    expect(cleanReason('  Because\n it  omits X. Vote: Player 3')).toBe('Because it omits X.');
  });
});
