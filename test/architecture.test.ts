// The layer order of docs/ARCHITECTURE.md over the whole of src/, for what ESLint's
// no-restricted-imports cannot see: dynamic `import()` and type-only imports forming a cycle.
// (a) No two folders of src/ import each other, directly or through others (types included).
// (b) A dynamic import goes downward only, like the static ones ESLint checks.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { ESLint } from 'eslint';
import { describe, expect, it } from 'vitest';

const LAYERS = ['gpu', 'ops', 'model', 'game', 'train', 'worker', 'cli', 'store', 'ui', 'web'];
const SRC = join(import.meta.dirname, '..', 'src');

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? files(p) : /\.tsx?$/.test(n) ? [p] : [];
  });
}

interface Edge {
  from: string;
  to: string;
  file: string;
  dynamic: boolean;
}

/** Every import between two folders of src/: static (values and types) and dynamic. */
function edges(): Edge[] {
  const out: Edge[] = [];
  for (const file of files(SRC)) {
    const from = relative(SRC, file).split('/')[0]!;
    const text = readFileSync(file, 'utf8');
    const add = (spec: string, dynamic: boolean) => {
      const m = /^\.\.\/([a-z]+)\//.exec(spec);
      if (m && m[1] !== from) out.push({ from, to: m[1]!, file: relative(SRC, file), dynamic });
    };
    for (const m of text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+'([^']+)'/gms)) add(m[1]!, false);
    for (const m of text.matchAll(/\bimport\(\s*'([^']+)'\s*\)/g)) add(m[1]!, true);
  }
  return out;
}

/** A cycle in the folder graph, as a path that returns to its start; null when there is none. */
export function findCycle(graph: Map<string, Set<string>>): string[] | null {
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (n: string): string[] | null => {
    if (state.get(n) === 'done') return null;
    if (state.get(n) === 'open') return [...path.slice(path.indexOf(n)), n];
    state.set(n, 'open');
    path.push(n);
    for (const m of graph.get(n) ?? []) {
      const c = visit(m);
      if (c) return c;
    }
    path.pop();
    state.set(n, 'done');
    return null;
  };
  for (const n of graph.keys()) {
    const c = visit(n);
    if (c) return c;
  }
  return null;
}

describe('architecture', () => {
  const all = edges();

  it('finds the imports between folders (the scan works)', () => {
    expect(all.some((e) => e.from === 'model' && e.to === 'gpu')).toBe(true);
    expect(all.some((e) => e.dynamic)).toBe(true);
  });

  it('the cycle finder reports a cycle and accepts a DAG', () => {
    const g = (pairs: [string, string][]) => {
      const m = new Map<string, Set<string>>();
      for (const [a, b] of pairs) m.set(a, (m.get(a) ?? new Set()).add(b));
      return m;
    };
    expect(
      findCycle(
        g([
          ['a', 'b'],
          ['b', 'c'],
          ['c', 'a'],
        ]),
      ),
    ).toEqual(['a', 'b', 'c', 'a']);
    expect(
      findCycle(
        g([
          ['a', 'b'],
          ['b', 'c'],
          ['a', 'c'],
        ]),
      ),
    ).toBeNull();
  });

  it('no import cycle between folders of src/, type imports included', () => {
    const graph = new Map<string, Set<string>>();
    for (const e of all) graph.set(e.from, (graph.get(e.from) ?? new Set()).add(e.to));
    const cycle = findCycle(graph);
    const along = (c: string[]) =>
      all.filter((e) => c.some((n, i) => n === e.from && c[i + 1] === e.to)).map((e) => `${e.file} → ${e.to}/`);
    expect(cycle ? `${cycle.join(' → ')} (${along(cycle).join(', ')})` : null).toBeNull();
  });

  it('every folder of src/ is a known layer, and dynamic imports go downward only', () => {
    for (const e of all) expect(LAYERS, `${e.file}: unknown folder`).toContain(e.from);
    const up = all.filter((e) => e.dynamic && LAYERS.indexOf(e.to) > LAYERS.indexOf(e.from));
    expect(up.map((e) => `${e.file} → ${e.to}/`)).toEqual([]);
  });
});

// The ESLint layer rules themselves (eslint.config.js), on probe files that are never written.
describe('layer rules', () => {
  const eslint = new ESLint({ cwd: join(import.meta.dirname, '..') });
  const errors = async (file: string, code: string) => {
    const [r] = await eslint.lintText(code + '\nexport const used = x;\n', { filePath: join(SRC, file) });
    return r!.messages.filter((m) => m.ruleId === '@typescript-eslint/no-restricted-imports').length;
  };
  it.each([
    ['model/probe.ts', "import { x } from '../train/spyrl.ts';", 1],
    ['model/probe.ts', "import type { x } from '../train/spyrl.ts';", 0],
    ['gpu/probe.ts', "import { x } from '../ops/index.ts';", 1],
    ['ops/probe.ts', "import { x } from '../gpu/index.ts';", 0],
    ['game/probe.ts', "import { x } from '../model/peft.ts';", 1],
    ['game/probe.ts', "import { x } from '../model/loraTargets.ts';", 0],
    ['game/probe.ts', "import { x } from '../gpu/index.ts';", 1],
    ['cli/probe.ts', "import { x } from '../worker/engine.ts';", 1],
    ['worker/probe.ts', "import { x } from '../cli/open.ts';", 1],
    ['store/probe.ts', "import { x } from '../model/qwen3.ts';", 1],
    ['store/probe.ts', "import { x } from '../model/config.ts';", 0],
    ['store/probe.ts', "import { x } from '../worker/client.ts';", 0],
    ['ui/probe.tsx', "import { x } from '../train/spyrl.ts';", 1],
    ['ui/probe.tsx', "import { x } from '../ops/index.ts';", 1],
    ['ui/probe.tsx', "import { x } from '../worker/engine.ts';", 1],
    ['ui/probe.tsx', "import { x } from '../store/hooks.ts';", 0],
  ])('%s: %s → %i error(s)', async (file, code, n) => {
    expect(await errors(file, code)).toBe(n);
  });
});
