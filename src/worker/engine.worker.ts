// The dedicated worker: one PlaygroundEngine exposed over comlink. All GPU work happens here,
// so the page stays responsive during a round.
import * as Comlink from 'comlink';
import { PlaygroundEngine } from './engine.ts';

Comlink.expose(new PlaygroundEngine());
