// A small WGSL preprocessor (the ggml-webgpu way): shared helpers and kernel variants come from
// defines, never from copies of a file.
//
//   #include "common/NAME.wgsl"                  the text of shaders/common/NAME.wgsl, once per module
//   #include "common/NAME.wgsl" (A=x, B=y)       a template: again each time, with {{A}}, {{B}} bound
//   #if EXPR / #elif EXPR / #else / #endif       EXPR: NAME, defined(NAME), !, ==, !=, <, <=, >, >=,
//   #ifdef NAME / #ifndef NAME                   &&, ||, parentheses, integer and bare-word literals
//   {{NAME}}                                     the value of define NAME (an error when undefined)
//
// A name used in an #if without defined() must be defined: a misspelt define is an error, not a
// silently false branch. Workgroup sizes are WGSL `override` constants (pipeline constants), not
// defines, so they need no text variant.

export type DefineValue = string | number | boolean;
export type Defines = Readonly<Record<string, DefineValue>>;

export interface PreprocessOptions {
  defines: Defines;
  /** Text of a shader by its path without `.wgsl`, e.g. 'common/reduce'. */
  include: (path: string) => string;
  /** For error messages: which shader (and variant) is being built. */
  label: string;
}

export class ShaderPreprocessError extends Error {
  override name = 'ShaderPreprocessError';
}

export function preprocess(source: string, opts: PreprocessOptions): string {
  const included = new Set<string>();
  return expand(source, opts.defines, opts, included, [opts.label]);
}

const INCLUDE = /^#include\s+"([\w/.-]+)\.wgsl"\s*(?:\((.*)\))?\s*$/;

function expand(
  source: string,
  defines: Defines,
  opts: PreprocessOptions,
  included: Set<string>,
  stack: string[],
): string {
  const where = (line: number) => `${stack[stack.length - 1]}:${line + 1}`;
  const fail = (line: number, msg: string): never => {
    throw new ShaderPreprocessError(`${opts.label}: ${where(line)}: ${msg}`);
  };
  // Each open #if: whether its enclosing text is live, whether a branch was taken, whether we are in it.
  const conds: { parentLive: boolean; taken: boolean; live: boolean; line: number; sawElse: boolean }[] = [];
  const live = () => (conds.length === 0 ? true : conds[conds.length - 1].live);
  const out: string[] = [];
  const lines = source.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i];
    const t = raw.trim();
    if (!t.startsWith('#')) {
      if (live()) out.push(substitute(raw, defines, (msg) => fail(i, msg)));
      continue;
    }
    const [, word, rest = ''] = /^#(\w+)\s*(.*)$/.exec(t) ?? [];
    const evalHere = (expr: string) => evaluate(expr, defines, (msg) => fail(i, msg));
    switch (word) {
      case 'if':
      case 'ifdef':
      case 'ifndef': {
        const parentLive = live();
        let value = false;
        if (parentLive) {
          if (word === 'if') value = evalHere(rest);
          else {
            if (!/^\w+$/.test(rest)) fail(i, `#${word} needs one name, got '${rest}'`);
            value = rest in defines === (word === 'ifdef');
          }
        }
        conds.push({ parentLive, taken: value, live: parentLive && value, line: i, sawElse: false });
        break;
      }
      case 'elif': {
        const c = conds[conds.length - 1] ?? fail(i, '#elif without #if');
        if (c.sawElse) fail(i, '#elif after #else');
        const value = c.parentLive && !c.taken && evalHere(rest);
        c.live = value;
        c.taken ||= value;
        break;
      }
      case 'else': {
        const c = conds[conds.length - 1] ?? fail(i, '#else without #if');
        if (c.sawElse) fail(i, 'second #else');
        c.sawElse = true;
        c.live = c.parentLive && !c.taken;
        c.taken = true;
        break;
      }
      case 'endif':
        if (!conds.pop()) fail(i, '#endif without #if');
        break;
      case 'include': {
        if (!live()) break;
        const m = INCLUDE.exec(t) ?? fail(i, `malformed #include: ${t}`);
        const path = m[1];
        if (!path.startsWith('common/')) fail(i, `#include "${path}.wgsl": only common/ helpers can be included`);
        if (stack.includes(path)) fail(i, `#include cycle: ${[...stack, path].join(' -> ')}`);
        let inner = defines;
        if (m[2] !== undefined) {
          inner = { ...defines, ...parseArgs(m[2], (msg) => fail(i, msg)) };
        } else {
          if (included.has(path)) break; // plain includes are once per module
          included.add(path);
        }
        let text: string;
        try {
          text = opts.include(path);
        } catch (e) {
          return fail(i, `#include "${path}.wgsl": ${(e as Error).message}`);
        }
        out.push(expand(text, inner, opts, included, [...stack, path]));
        break;
      }
      default:
        if (live()) fail(i, `unknown directive #${word ?? t}`);
    }
  }
  if (conds.length) fail(conds[conds.length - 1].line, '#if without #endif');
  return out.join('\n');
}

function substitute(line: string, defines: Defines, fail: (msg: string) => never): string {
  if (!line.includes('{{')) return line;
  return line.replace(/\{\{(\w+)\}\}/g, (_, name: string) => {
    const v = defines[name];
    if (v === undefined) fail(`{{${name}}} is not defined`);
    return typeof v === 'boolean' ? (v ? 'true' : 'false') : String(v);
  });
}

function parseArgs(text: string, fail: (msg: string) => never): Record<string, string> {
  const args: Record<string, string> = {};
  for (const part of text.split(',')) {
    const m = /^\s*(\w+)\s*=\s*(.*?)\s*$/.exec(part) ?? fail(`bad #include argument '${part.trim()}'`);
    args[m[1]] = m[2];
  }
  return args;
}

// ---- #if expressions: a small recursive-descent evaluator -------------------------------------

type Value = number | string | boolean;

function evaluate(expr: string, defines: Defines, fail: (msg: string) => never): boolean {
  const tokens = expr.match(/\s*(\d+|\w+|&&|\|\||==|!=|<=|>=|[()!<>])\s*/gy)?.map((s) => s.trim()) ?? [];
  if (tokens.join('').length !== expr.replace(/\s+/g, '').length) fail(`cannot parse #if expression '${expr}'`);
  let k = 0;
  let quiet = 0; // > 0 while parsing an operand that short-circuiting leaves unevaluated
  const peek = () => tokens[k];
  const next = () => tokens[k++];
  const truthy = (v: Value) => v !== false && v !== 0 && v !== '0' && v !== 'false' && v !== '';
  const primary = (): Value => {
    const t = next();
    if (t === undefined) return fail(`#if expression '${expr}' ends early`);
    if (t === '(') {
      const v = or();
      if (next() !== ')') fail(`missing ')' in '${expr}'`);
      return v;
    }
    if (t === '!') return !truthy(primary());
    if (t === 'defined') {
      const paren = peek() === '(';
      if (paren) next();
      const name = next();
      if (!name || !/^\w+$/.test(name)) fail(`defined() needs a name in '${expr}'`);
      if (paren && next() !== ')') fail(`missing ')' in '${expr}'`);
      return name in defines;
    }
    if (/^\d+$/.test(t)) return Number(t);
    if (!/^\w+$/.test(t)) return fail(`unexpected '${t}' in '${expr}'`);
    if (t in defines) return defines[t];
    // An undefined bare word is a literal only right of == / != (WEIGHTS == q4).
    if (!quiet && !isLiteralContext(tokens, k - 1)) fail(`'${t}' is not defined (use defined(${t}) to test for it)`);
    return t;
  };
  const compare = (): Value => {
    let a = primary();
    while (['==', '!=', '<', '<=', '>', '>='].includes(peek() ?? '')) {
      const op = next();
      const b = primary();
      const [x, y] = typeof a === 'number' || typeof b === 'number' ? [Number(a), Number(b)] : [String(a), String(b)];
      a =
        op === '=='
          ? x === y
          : op === '!='
            ? x !== y
            : op === '<'
              ? x < y
              : op === '<='
                ? x <= y
                : op === '>'
                  ? x > y
                  : x >= y;
    }
    return a;
  };
  const and = (): Value => {
    let a = compare();
    while (peek() === '&&') {
      next();
      const skip = !truthy(a);
      if (skip) quiet++;
      const b = compare();
      if (skip) quiet--;
      a = truthy(a) && truthy(b);
    }
    return a;
  };
  const or = (): Value => {
    let a = and();
    while (peek() === '||') {
      next();
      const skip = truthy(a);
      if (skip) quiet++;
      const b = and();
      if (skip) quiet--;
      a = truthy(a) || truthy(b);
    }
    return a;
  };
  const v = or();
  if (k !== tokens.length) fail(`unexpected '${tokens[k]}' in '${expr}'`);
  return truthy(v);
}

/** The right-hand side of == / != may be a bare literal word (`WEIGHTS == q4`). */
function isLiteralContext(tokens: string[], i: number): boolean {
  return i > 0 && (tokens[i - 1] === '==' || tokens[i - 1] === '!=');
}
