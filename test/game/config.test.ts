import { describe, expect, it } from 'vitest';
import {
  CONFIG_FIELDS,
  ConfigError,
  DEFAULT_CONFIG,
  configLeaves,
  describeConfig,
  validateConfig,
} from '../../src/game/config.ts';

describe('SpyRLConfig', () => {
  it('defaults validate and match the issue', () => {
    const cfg = validateConfig({});
    expect(cfg).toEqual(DEFAULT_CONFIG);
    expect(cfg).not.toBe(DEFAULT_CONFIG);
    expect(cfg.groupSize).toBe(4);
    expect(cfg.maskRatio).toBe(0.2);
    expect(cfg.maskMode).toBe('remove');
    expect(cfg.ppo.clipEps).toBe(0.2);
    expect(cfg.advantages.spyBaseline).toBe('running-mean');
  });

  it('every setting has a check and a reason, and nothing else does', () => {
    const leaves = configLeaves()
      .map(([p]) => p)
      .sort();
    expect(Object.keys(CONFIG_FIELDS).sort()).toEqual(leaves);
    for (const p of leaves) expect(CONFIG_FIELDS[p]!.why.length).toBeGreaterThan(5);
    for (const [p, v] of configLeaves()) expect(CONFIG_FIELDS[p]!.check(v)).toBeNull();
    expect(describeConfig().split('\n')).toHaveLength(leaves.length + 2);
  });

  it('merges nested overrides without touching the defaults', () => {
    const cfg = validateConfig({
      groupSize: 6,
      rewards: { spyVote: 0.5 },
      lora: { targetModules: ['v_proj', 'q_proj'] },
    });
    expect(cfg.groupSize).toBe(6);
    expect(cfg.rewards).toEqual({ ...DEFAULT_CONFIG.rewards, spyVote: 0.5 });
    expect(cfg.lora.targetModules).toEqual(['q_proj', 'v_proj']);
    expect(DEFAULT_CONFIG.rewards.spyVote).toBe(0);
    expect(DEFAULT_CONFIG.lora.targetModules).toHaveLength(7);
  });

  it('rejects unknown keys and bad values, naming the field', () => {
    const err = (input: unknown) => {
      try {
        validateConfig(input);
      } catch (e) {
        expect(e).toBeInstanceOf(ConfigError);
        return (e as ConfigError).message;
      }
      throw new Error('accepted');
    };
    expect(err({ groupsize: 4 })).toMatch(/^config\.groupsize: unknown key/);
    expect(err({ rewards: { catch: 1 } })).toMatch(/^config\.rewards\.catch: unknown key \(known here: catchSpy/);
    expect(err({ groupSize: 9 })).toMatch(/^config\.groupSize: must be an integer in 3\.\.8, got 9/);
    expect(err({ groupSize: 3.5 })).toMatch(/groupSize/);
    expect(err({ maskRatio: 0 })).toMatch(/^config\.maskRatio: must be a number in \(0, 0\.9\]/);
    expect(err({ maskMode: 'hide' })).toMatch(/^config\.maskMode: must be one of "remove", "placeholder"/);
    expect(err({ sampling: { topP: 1.5 } })).toMatch(/^config\.sampling\.topP/);
    expect(err({ sampling: 1 })).toMatch(/^config\.sampling: must be an object/);
    expect(err({ prompts: { voteQuestion: 'Who is the spy?' } })).toMatch(
      /^config\.prompts\.voteQuestion: must contain \{self\}/,
    );
    expect(err({ lora: { targetModules: ['lm_head'] } })).toMatch(
      /^config\.lora\.targetModules: unknown LoRA target "lm_head"/,
    );
    expect(err({ voteReason: 'yes' })).toMatch(/^config\.voteReason: must be true or false/);
    expect(err([])).toMatch(/must be an object/);
  });

  it('round-trips through JSON (the config written next to a run)', () => {
    const cfg = validateConfig({ seed: 7, evalEvery: 0 });
    expect(validateConfig(JSON.parse(JSON.stringify(cfg)))).toEqual(cfg);
  });
});
