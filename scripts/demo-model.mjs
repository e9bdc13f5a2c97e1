#!/usr/bin/env node
// Writes the bundled tiny demo model to public/tiny-demo/ (deterministic, generated here, never
// downloaded) with a manifest.json listing its files; skipped when an identical one is there.
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { join, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const out = join(root, 'public', 'tiny-demo');
// The demo model: Qwen3-shaped, random weights, real tokenizer and vocabulary.
const args = [
  '--layers',
  '2',
  '--hidden',
  '64',
  '--heads',
  '4',
  '--kv-heads',
  '2',
  '--head-dim',
  '16',
  '--intermediate',
  '128',
  '--tied',
  'true',
  '--shards',
  '1',
  '--seed',
  '0',
];
const stamp = JSON.stringify({ args, version: 2 });
const manifestPath = join(out, 'manifest.json');

if (existsSync(manifestPath)) {
  const m = JSON.parse(readFileSync(manifestPath, 'utf8'));
  if (m.stamp === stamp && m.files.every((f) => existsSync(join(out, f)))) process.exit(0);
}
rmSync(out, { recursive: true, force: true });
const res = execFileSync(process.execPath, [join(root, 'bin', 'spyrl.mjs'), 'tiny-model', '--out', out, ...args], {
  encoding: 'utf8',
});
const { files } = JSON.parse(res.trim().split('\n').pop());
writeFileSync(
  manifestPath,
  JSON.stringify({ name: 'tiny-demo (random Qwen3, 2 layers, hidden 64)', stamp, files }, null, 2),
);
console.log(`demo model: wrote ${files.length} files to public/tiny-demo/`);
