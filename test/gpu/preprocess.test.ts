// The WGSL preprocessor (src/gpu/preprocess.ts): includes, templates, conditionals, defines, and
// one clear error for each misuse. Pure text, no GPU.
import { describe, expect, it } from 'vitest';
import { preprocess } from '../../src/gpu/preprocess.ts';
import { shaderSource } from '../../src/gpu/shaders.node.ts';

const files: Record<string, string> = {
  'common/a': 'fn a() {}',
  'common/b': '#include "common/a.wgsl"\nfn b() {}',
  'common/t': 'fn {{NAME}}(v: {{T}}) -> {{T}} { return v; }',
  'common/cycle': '#include "common/cycle.wgsl"',
};
const include = (p: string) => {
  const t = files[p];
  if (t === undefined) throw new Error(`no such file`);
  return t;
};
const run = (src: string, defines: Record<string, string | number | boolean> = {}) =>
  preprocess(src, { defines, include, label: 'x' })
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean);

describe('WGSL preprocessor', () => {
  it('includes a helper once per module, nested includes too', () => {
    expect(run('#include "common/a.wgsl"\n#include "common/b.wgsl"\n#include "common/a.wgsl"')).toEqual([
      'fn a() {}',
      'fn b() {}',
    ]);
  });

  it('instantiates a template include each time with its arguments', () => {
    expect(run('#include "common/t.wgsl" (NAME=f, T=f32)\n#include "common/t.wgsl" (NAME=g, T=u32)')).toEqual([
      'fn f(v: f32) -> f32 { return v; }',
      'fn g(v: u32) -> u32 { return v; }',
    ]);
  });

  it('#if / #elif / #else / #endif, #ifdef / #ifndef, nested, with defines in expressions', () => {
    const src = [
      '#if WEIGHTS == q4',
      'q4',
      '#elif WEIGHTS == bf16',
      'bf16',
      '#else',
      'other',
      '#endif',
      '#ifdef SUBGROUPS',
      'sg',
      '#ifndef X',
      'noX',
      '#endif',
      '#endif',
      '#if defined(N) && N >= 4 || !defined(SUBGROUPS)',
      'big',
      '#endif',
    ].join('\n');
    expect(run(src, { WEIGHTS: 'q4', SUBGROUPS: 1, N: 4 })).toEqual(['q4', 'sg', 'noX', 'big']);
    expect(run(src, { WEIGHTS: 'bf16', N: 2 })).toEqual(['bf16', 'big']);
    expect(run(src, { WEIGHTS: 'f32', SUBGROUPS: 1, X: 1 })).toEqual(['other', 'sg']);
  });

  it('substitutes {{NAME}} and refuses an undefined one', () => {
    expect(run('const A = {{A}}u; const B = {{B}};', { A: 3, B: true })).toEqual(['const A = 3u; const B = true;']);
    expect(() => run('const A = {{A}}u;')).toThrow(/\{\{A\}\} is not defined/);
  });

  it('refuses a misspelt define in #if instead of taking the false branch', () => {
    expect(() => run('#if WEIGTHS == q4\n#endif', { WEIGHTS: 'q4' })).toThrow(/'WEIGTHS' is not defined/);
  });

  it('names the line of an unbalanced or unknown directive, a missing file and a cycle', () => {
    expect(() => run('#if 1\nx')).toThrow(/x:1: #if without #endif/);
    expect(() => run('#endif')).toThrow(/#endif without #if/);
    expect(() => run('#if 1\n#else\n#else\n#endif')).toThrow(/x:3: second #else/);
    expect(() => run('#pragma once')).toThrow(/unknown directive #pragma/);
    expect(() => run('#include "common/nope.wgsl"')).toThrow(/common\/nope.wgsl.*no such file/);
    expect(() => run('#include "../x.wgsl"')).toThrow(/malformed #include|only common/);
    expect(() => run('#include "common/cycle.wgsl"')).toThrow(/cycle/);
  });

  it('skips includes and directives inside a false branch', () => {
    expect(run('#if 0\n#include "common/nope.wgsl"\n#bogus\n#endif\nok')).toEqual(['ok']);
  });

  it('every shader file preprocesses for each of its variants without leftover placeholders', () => {
    const variants: [string, Record<string, string | number>][] = [
      ['rmsnorm', {}],
      ['rmsnorm', { SUBGROUPS: 1 }],
      ['sample', {}],
      ['sample', { SUBGROUPS: 1 }],
      ['loss', {}],
      ['loss', { SUBGROUPS: 1 }],
      ['matmul', { WEIGHTS: 'bf16', TMAX: 4, LANES: 64 }],
      ['matmul', { WEIGHTS: 'q4', TMAX: 1, LANES: 16, SUBGROUPS: 1 }],
      ['matmul', { WEIGHTS: 'f32', TILED: 1 }],
      ['gemv', { WEIGHTS: 'q4', TMAX: 8, COLS: 4 }],
      ['gemv', { WEIGHTS: 'bf16', TMAX: 1, COLS: 1 }],
      ['gemv', { WEIGHTS: 'f32', TMAX: 2, COLS: 2 }],
      ['embed', { WEIGHTS: 'q4' }],
      ['embed', { WEIGHTS: 'bf16' }],
      ['attention', {}],
      ['attention', { KV: 'f16' }],
      ['attention', { KV: 'f32' }],
      ['elementwise', {}],
      ['embed', { WEIGHTS: 'f32' }],
      ['optim', {}],
      ['rope', {}],
      ['convert', { FORMAT: 'f16' }],
      ['convert', { FORMAT: 'bf16' }],
      ['quant', {}],
    ];
    for (const [shader, defines] of variants) {
      const text = preprocess(shaderSource(shader), { defines, include: shaderSource, label: shader });
      expect(text, `${shader} ${JSON.stringify(defines)}`).not.toMatch(/\{\{|^\s*#/m);
    }
  });
});
