// The ops layer: one typed wrapper per kernel, forward, backward, loss and optimizer
// (docs/ENGINE.md). Callers import it as `import * as K from '../ops/index.ts'`.
export * from './common.ts';
export * from './forward.ts';
export * from './backward.ts';
export * from './loss.ts';
export * from './optimizer.ts';
export * from './quant.ts';
export * from './convert.ts';
export { attentionVariant, treeAttentionSupported } from './attentionTiled.ts';
