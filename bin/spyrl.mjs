#!/usr/bin/env node
// The `spyrl` command: TypeScript sources run through tsx, so the CLI and the app share one engine.
import { register } from 'tsx/esm/api';
import './gpu-env.mjs';

register();
const { main } = await import('../src/cli/main.ts');
process.exitCode = await main(process.argv.slice(2));
