// The dedicated worker: one PlaygroundEngine exposed over comlink. All GPU work happens here,
// so the page stays responsive during a round.
import * as Comlink from 'comlink';
import { PlaygroundEngine } from './engine.ts';
import { registerErrorTransfer } from './errors.ts';
import { setTokenizerWatch } from '../model/tokenizer.ts';
import { workerWatch } from './tokenizerWatch.ts';

setTokenizerWatch(workerWatch((m) => self.postMessage(m))); // the page's watchdog (client.ts) stops a runaway tokenizer call

registerErrorTransfer(); // what the engine throws crosses typed: a GpuDeviceLostError arrives with kind 'device-lost'
Comlink.expose(new PlaygroundEngine());
