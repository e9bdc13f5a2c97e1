// The config panel's fields: which SpyRLConfig settings the panel shows, how a typed value
// becomes a config value, and validation through validateConfig (the one source of rules).
import { ConfigError, DEFAULT_CONFIG, configLeaves, validateConfig, type SpyRLConfig } from '../game/config.ts';
import { LORA_TARGETS } from '../model/loraTargets.ts';

export type FieldKind = 'int' | 'number' | 'select' | 'targets';

export interface FormField {
  path: string;
  label: string;
  kind: FieldKind;
  options?: readonly string[];
  group: 'Game' | 'Sampling' | 'LoRA' | 'Optimisation' | 'Run';
}

export const FORM_FIELDS: FormField[] = [
  { path: 'groupSize', label: 'Group size', kind: 'int', group: 'Game' },
  { path: 'maskRatio', label: 'Mask ratio', kind: 'number', group: 'Game' },
  { path: 'maskMode', label: 'Mask mode', kind: 'select', options: ['remove', 'placeholder'], group: 'Game' },
  { path: 'docTokenBudget', label: 'Document token budget', kind: 'int', group: 'Game' },
  { path: 'summaryMaxTokens', label: 'Summary max tokens', kind: 'int', group: 'Game' },
  { path: 'sampling.temperature', label: 'Temperature', kind: 'number', group: 'Sampling' },
  { path: 'sampling.topP', label: 'Top-p', kind: 'number', group: 'Sampling' },
  { path: 'sampling.topK', label: 'Top-k', kind: 'int', group: 'Sampling' },
  { path: 'lora.r', label: 'LoRA rank', kind: 'int', group: 'LoRA' },
  { path: 'lora.alpha', label: 'LoRA alpha', kind: 'number', group: 'LoRA' },
  { path: 'lora.targetModules', label: 'LoRA targets', kind: 'targets', options: LORA_TARGETS, group: 'LoRA' },
  { path: 'optimizer.lr', label: 'Learning rate', kind: 'number', group: 'Optimisation' },
  { path: 'ppo.clipEps', label: 'PPO clip', kind: 'number', group: 'Optimisation' },
  { path: 'optimizer.maxGradNorm', label: 'Grad-norm clip', kind: 'number', group: 'Optimisation' },
  { path: 'ppo.klBeta', label: 'KL weight', kind: 'number', group: 'Optimisation' },
  { path: 'roundsPerUpdate', label: 'Rounds per update', kind: 'int', group: 'Optimisation' },
  { path: 'evalEvery', label: 'Eval interval', kind: 'int', group: 'Run' },
  { path: 'evalHeldOut', label: 'Held-out reports', kind: 'int', group: 'Run' },
  { path: 'evalDocTokenBudget', label: 'Eval report tokens', kind: 'int', group: 'Run' },
  { path: 'evalSummaryMaxTokens', label: 'Eval summary tokens', kind: 'int', group: 'Run' },
  { path: 'checkpointEvery', label: 'Autosave interval', kind: 'int', group: 'Run' },
  { path: 'seed', label: 'Seed', kind: 'int', group: 'Run' },
];

/** What the user typed, per field path (numbers as text so "5e-5" can be typed). */
export type ConfigDraft = Record<string, string | string[]>;

export function draftFromConfig(cfg: SpyRLConfig): ConfigDraft {
  const leaves = new Map(configLeaves(cfg));
  const draft: ConfigDraft = {};
  for (const f of FORM_FIELDS) {
    const v = leaves.get(f.path);
    draft[f.path] = Array.isArray(v) ? v.map(String) : String(v);
  }
  return draft;
}

export const PRESETS: Record<string, { label: string; config: SpyRLConfig; note: string }> = {
  paper: {
    label: 'Paper defaults',
    config: DEFAULT_CONFIG,
    note: 'the settings of the SpyRL paper, for a real Qwen3 model on a real GPU',
  },
  quick: {
    label: 'Quick demo',
    config: validateConfig({
      groupSize: 3,
      docTokenBudget: 96,
      summaryMaxTokens: 12,
      roundsPerUpdate: 1,
      evalEvery: 0,
      checkpointEvery: 5,
      lora: { r: 4, alpha: 8 },
    }),
    note: 'short documents and summaries: rounds in seconds on the tiny demo model or a software GPU',
  },
};

function setPath(obj: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split('.');
  let o = obj;
  for (const k of keys.slice(0, -1)) o = (o[k] ??= {}) as Record<string, unknown>;
  o[keys.at(-1)!] = value;
}

function parseValue(f: FormField, raw: string | string[]): unknown {
  if (f.kind === 'targets') return raw;
  if (f.kind === 'select') return raw;
  const s = String(raw).trim();
  // Empty or non-numeric text goes through as is, so validateConfig names the field.
  return s !== '' && Number.isFinite(Number(s)) ? Number(s) : s;
}

/** The draft over `base` (the fields the panel does not show keep their values there). */
export function configFromDraft(
  draft: ConfigDraft,
  base: SpyRLConfig,
): { config: SpyRLConfig | null; error: { field: string; message: string } | null } {
  const input = structuredClone(base) as unknown as Record<string, unknown>;
  for (const f of FORM_FIELDS) if (draft[f.path] !== undefined) setPath(input, f.path, parseValue(f, draft[f.path]!));
  try {
    return { config: validateConfig(input), error: null };
  } catch (e) {
    if (e instanceof ConfigError) return { config: null, error: { field: e.field, message: e.message } };
    throw e;
  }
}
