// The downloadable adapter: a zip of the PEFT files plus a README model card, and the reverse
// (an uploaded zip or folder back into files the trainer can continue from).
import { strToU8, unzipSync, zipSync } from 'fflate';
import { configLeaves, type SpyRLConfig } from '../game/config.ts';
import type { TrainEvent } from '../train/events.ts';
import type { RunFiles } from './runStorage.ts';

/** Running totals of a run, fed by its events; what the model card reports. */
export interface RunSummary {
  rounds: number;
  optimizerSteps: number;
  /** Last `window` rounds. */
  recent: { rounds: number; spyCaughtRate: number; voteAccuracy: number; civilianReward: number; spyReward: number };
  lastUpdate: { loss: number; kl: number; gradNorm: number } | null;
  lastEval: { round: number; base: number; adapter: number } | null;
}

const WINDOW = 20;

export class RunSummarizer {
  private rounds: { caught: number; accuracy: number; civilian: number; spy: number }[] = [];
  private steps = 0;
  private lastUpdate: RunSummary['lastUpdate'] = null;
  private lastEval: RunSummary['lastEval'] = null;
  private roundsSeen = 0;

  constructor(startRound = 0) {
    this.roundsSeen = startRound;
  }

  add(e: TrainEvent): void {
    if (e.type === 'round-done') {
      const r = e.record;
      const civ = r.rewards.summary.filter((_, seat) => seat !== r.spySeat);
      this.rounds.push({
        caught: r.metrics.spyCaught ? 1 : 0,
        accuracy: r.metrics.voteAccuracy,
        civilian: civ.reduce((a, b) => a + b, 0) / Math.max(1, civ.length),
        spy: r.rewards.summary[r.spySeat] ?? 0,
      });
      if (this.rounds.length > WINDOW) this.rounds.shift();
      this.roundsSeen = Math.max(this.roundsSeen, e.round + 1);
    } else if (e.type === 'update' && !e.skipped) {
      this.steps = Math.max(this.steps, e.step);
      this.lastUpdate = { loss: e.loss, kl: e.kl, gradNorm: e.gradNorm };
    } else if (e.type === 'eval') {
      this.lastEval = { round: e.round, base: e.base, adapter: e.adapter };
    }
  }

  summary(): RunSummary {
    const n = this.rounds.length;
    const mean = (k: 'caught' | 'accuracy' | 'civilian' | 'spy') => (n ? this.rounds.reduce((a, r) => a + r[k], 0) / n : 0);
    return {
      rounds: this.roundsSeen,
      optimizerSteps: this.steps,
      recent: { rounds: n, spyCaughtRate: mean('caught'), voteAccuracy: mean('accuracy'), civilianReward: mean('civilian'), spyReward: mean('spy') },
      lastUpdate: this.lastUpdate,
      lastEval: this.lastEval,
    };
  }
}

const f3 = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : String(x));

/** README.md for the adapter: base model, config, rounds, metrics and how to load it with PEFT. */
export function modelCard(opts: { baseModel: string; baseIsHub: boolean; config: SpyRLConfig; summary: RunSummary; date: Date }): string {
  const { baseModel, baseIsHub, config, summary: s } = opts;
  const loadFrom = baseIsHub ? baseModel : 'path/to/the/base/model';
  const metrics = [
    ['rounds played', String(s.rounds)],
    ['optimizer steps', String(s.optimizerSteps)],
    [`spy caught (last ${s.recent.rounds} rounds)`, f3(s.recent.spyCaughtRate)],
    [`civilian vote accuracy (last ${s.recent.rounds} rounds)`, f3(s.recent.voteAccuracy)],
    [`civilian summary reward (last ${s.recent.rounds} rounds)`, f3(s.recent.civilianReward)],
    [`spy summary reward (last ${s.recent.rounds} rounds)`, f3(s.recent.spyReward)],
    ...(s.lastUpdate ? [['last loss', f3(s.lastUpdate.loss)], ['last KL', f3(s.lastUpdate.kl)], ['last grad norm', f3(s.lastUpdate.gradNorm)]] : []),
    ...(s.lastEval
      ? [[`ROUGE-L F1, held-out reports, base (round ${s.lastEval.round})`, f3(s.lastEval.base)], [`ROUGE-L F1, held-out reports, adapter (round ${s.lastEval.round})`, f3(s.lastEval.adapter)]]
      : [['ROUGE-L on held-out reports', 'not evaluated in this run']]),
  ];
  const settings = configLeaves(config)
    .filter(([path]) => !path.startsWith('prompts.'))
    .map(([path, v]) => `| \`${path}\` | \`${JSON.stringify(v)}\` |`);
  return `---
${baseIsHub ? `base_model: ${baseModel}\n` : ''}library_name: peft
tags:
- lora
- spyrl
- self-play
- summarization
---

# SpyRL LoRA adapter for ${baseModel}

A LoRA adapter trained in the browser with SpyRL Playground by self-play in "Who Is the Spy?":
each round ${config.groupSize} copies of the model summarize a report, one of them (the spy) from a
copy with ${Math.round(config.maskRatio * 100)}% of it removed, then each votes on who the spy is.
Civilians are rewarded for catching the spy and for summaries nobody suspects, which rewards
complete, faithful summaries.

- Base model: \`${baseModel}\`${baseIsHub ? '' : ' (loaded from a local folder or the bundled demo checkpoint)'}
- LoRA: r = ${config.lora.r}, alpha = ${config.lora.alpha}, targets ${config.lora.targetModules.join(', ')}
- Saved: ${opts.date.toISOString()}

## Metrics

| metric | value |
|---|---|
${metrics.map(([k, v]) => `| ${k} | ${v} |`).join('\n')}

## Training settings

| setting | value |
|---|---|
${settings.join('\n')}

## Load with PEFT

\`\`\`python
from transformers import AutoModelForCausalLM, AutoTokenizer
from peft import PeftModel

base = AutoModelForCausalLM.from_pretrained("${loadFrom}", torch_dtype="bfloat16")
tokenizer = AutoTokenizer.from_pretrained("${loadFrom}")
model = PeftModel.from_pretrained(base, "path/to/this/unzipped/folder")
model = model.merge_and_unload()  # optional: fold the adapter into the weights
\`\`\`
`;
}

export function zipFiles(files: RunFiles): Uint8Array {
  const entries: Record<string, Uint8Array> = {};
  for (const [name, f] of Object.entries(files)) entries[name] = typeof f === 'string' ? strToU8(f) : f;
  return zipSync(entries, { level: 6 });
}

/** Files from a zip (folders inside it flattened to base names) or from a folder pick. */
export async function readAdapterUpload(files: File[]): Promise<RunFiles> {
  const out: RunFiles = {};
  const add = (path: string, bytes: Uint8Array) => {
    const name = path.split('/').at(-1)!;
    if (!name || path.endsWith('/') || path.startsWith('__MACOSX/')) return;
    out[name] = /\.(json|jsonl|md)$/.test(name) ? new TextDecoder().decode(bytes) : bytes;
  };
  for (const f of files) {
    const bytes = new Uint8Array(await f.arrayBuffer());
    if (f.name.toLowerCase().endsWith('.zip')) {
      let entries: Record<string, Uint8Array>;
      try {
        entries = unzipSync(bytes);
      } catch (e) {
        throw new Error(`${f.name}: not a readable zip (${(e as Error).message})`);
      }
      for (const [path, b] of Object.entries(entries)) add(path, b);
    } else {
      add(f.webkitRelativePath || f.name, bytes);
    }
  }
  return out;
}
