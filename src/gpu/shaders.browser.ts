// Shader text in the browser: every shaders/**/*.wgsl inlined by Vite at build time.
const files = import.meta.glob('/shaders/**/*.wgsl', { query: '?raw', import: 'default', eager: true }) as Record<
  string,
  string
>;

export function shaderSource(name: string): string {
  const text = files[`/shaders/${name}.wgsl`];
  if (text === undefined) throw new Error(`no shader shaders/${name}.wgsl in the bundle`);
  return text;
}
