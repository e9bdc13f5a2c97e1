// The q4 golden fixtures (test/fixtures/golden-q4/<variant>/expected.json, written by
// scripts/golden_q4.py): the tokens, the reference logits' scale and tolerance, and the sha256 of
// every packed q4 tensor.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ROOT } from './spyrl.ts';

export const GOLDEN = join(ROOT, 'test/fixtures/golden');
export const GOLDEN_Q4 = join(ROOT, 'test/fixtures/golden-q4');

export interface GoldenQ4Expected {
  tokens: number[];
  shape: [number, number];
  max_abs_logit: number;
  tolerance: { rel: number };
  q4: Record<string, { sha256: string }>;
}

export async function goldenQ4Expected(variant: string): Promise<GoldenQ4Expected> {
  return JSON.parse(await readFile(join(GOLDEN_Q4, variant, 'expected.json'), 'utf8')) as GoldenQ4Expected;
}
