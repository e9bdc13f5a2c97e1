// Shader text in Node: read shaders/<name>.wgsl (name may be 'common/x') from the repository (cached).
import { readFileSync } from 'node:fs';

const dir = new URL('../../shaders/', import.meta.url);
const cache = new Map<string, string>();

export function shaderSource(name: string): string {
  let text = cache.get(name);
  if (text === undefined) {
    if (!/^[\w-]+(\/[\w-]+)?$/.test(name)) throw new Error(`bad shader name '${name}'`);
    text = readFileSync(new URL(`${name}.wgsl`, dir), 'utf8');
    cache.set(name, text);
  }
  return text;
}
