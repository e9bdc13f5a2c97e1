// ESLint: typescript-eslint's recommended rules over all TypeScript, React hooks rules over the UI,
// and the layer rules of docs/ARCHITECTURE.md over src/ (a layer imports only downward:
// gpu ← ops ← model ← game ← train ← worker/cli ← store ← ui ← web). `import type` is always
// allowed: types cost nothing at run time and cross layers freely. test/architecture.test.ts
// checks the same order for dynamic imports and that no two folders import each other.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';
import reactHooks from 'eslint-plugin-react-hooks';
import globals from 'globals';

const LAYERS = ['gpu', 'ops', 'model', 'game', 'train', 'worker', 'cli', 'store', 'ui', 'web'];

/** One restricted-imports rule: the folders a layer may not import (values; types are free). */
function layerRule(forbidden, pure = []) {
  const patterns = [];
  for (const name of forbidden) {
    const keep = pure.filter((p) => p.startsWith(`${name}/`));
    patterns.push({
      group: [`../${name}/*`, ...keep.map((p) => `!../${p}`)],
      allowTypeImports: true,
      message: `layer rule (docs/ARCHITECTURE.md): this folder may not import ${name}/ at run time${keep.length ? ` except ${keep.join(', ')}` : ''}; use \`import type\` for types`,
    });
  }
  return { '@typescript-eslint/no-restricted-imports': ['error', { patterns }] };
}

const above = (layer) => LAYERS.slice(LAYERS.indexOf(layer) + 1);

/** Modules of lower layers that hold plain data and arithmetic only (no GPU, no files). */
const PURE = [
  'model/config.ts',
  'model/format.ts',
  'model/loraTargets.ts',
  'ops/tuning.ts',
  'train/memory.ts',
  'train/runPlan.ts',
  'train/evaluate.ts',
];

export default tseslint.config(
  {
    ignores: [
      'dist/**',
      'node_modules/**',
      'public/**',
      'test-results/**',
      'playwright-report/**',
      '.venv*/**',
      '.device/**',
      'device-out/**',
      '.cache/**',
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { ...globals.browser, ...globals.node } },
    rules: {
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' },
      ],
      '@typescript-eslint/no-explicit-any': 'off',
    },
  },
  {
    files: ['src/ui/**/*.tsx', 'src/web/**/*.tsx'],
    plugins: { 'react-hooks': reactHooks },
    rules: {
      // The classic hook rules; the React Compiler rules of the plugin's preset do not apply (no compiler here).
      'react-hooks/rules-of-hooks': 'error',
      'react-hooks/exhaustive-deps': 'error',
    },
  },
  { files: ['src/gpu/**'], rules: layerRule(above('gpu')) },
  { files: ['src/ops/**'], rules: layerRule(above('ops')) },
  { files: ['src/model/**'], rules: layerRule(above('model')) },
  // game is pure TypeScript: no GPU, and from model only its plain config data.
  { files: ['src/game/**'], rules: layerRule(['gpu', 'ops', 'model', ...above('game')], PURE) },
  { files: ['src/train/**'], rules: layerRule(above('train')) },
  // worker and cli are siblings: both drive train/, neither imports the other.
  { files: ['src/worker/**'], rules: layerRule(['cli', 'store', 'ui', 'web']) },
  { files: ['src/cli/**'], rules: layerRule(['worker', 'store', 'ui', 'web']) },
  // store talks to the engine through the worker's client/protocol only.
  {
    files: ['src/store/**'],
    rules: layerRule(
      ['gpu', 'ops', 'model', 'train', 'worker', 'cli', 'ui', 'web'],
      [...PURE, 'worker/client.ts', 'worker/protocol.ts'],
    ),
  },
  {
    files: ['src/ui/**'],
    rules: layerRule(
      ['gpu', 'ops', 'model', 'train', 'worker', 'cli', 'web'],
      [...PURE, 'worker/client.ts', 'worker/protocol.ts'],
    ),
  },
);
