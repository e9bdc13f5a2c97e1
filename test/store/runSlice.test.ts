// The run slice driving a scripted engine: the statuses the controls go through (every change via
// src/store/runStatus.ts), Reset during a round, failures, and a lost device that crosses a real
// comlink channel as a typed error. The engine's rounds are gated so a test decides when one ends.
import { MessageChannel } from 'node:worker_threads';
import * as Comlink from 'comlink';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { GpuDeviceLostError } from '../../src/gpu/errors.ts';
import type { RoundRecord } from '../../src/game/round.ts';
import { createAppStore, type AppStore } from '../../src/store/store.ts';
import type { RunStatus } from '../../src/store/runStatus.ts';
import type { TrainEvent } from '../../src/train/events.ts';
import type { EngineApi } from '../../src/worker/client.ts';
import { registerErrorTransfer } from '../../src/worker/errors.ts';
import type { LoadedModelInfo, SavedRunMeta } from '../../src/worker/protocol.ts';

const doc = { id: 'a', report: 'The agency audited its programs. It found gaps.' };

/** The engine methods the run slice calls, scripted: each step waits for `endRound()`. */
function scriptedEngine(opts: { eventsAfterReply?: boolean } = {}) {
  const calls: string[] = [];
  const gates: (() => void)[] = [];
  let onEvent: ((e: TrainEvent) => void) | null = null;
  let round = 0;
  let startGate: Promise<void> | null = null;
  let failNext: Error | null = null;
  let failStart: Error | null = null;
  const meta = (): SavedRunMeta => ({
    version: 1,
    runId: 'r',
    savedAt: 0,
    round,
    model: { kind: 'demo' },
    modelName: 'tiny',
    config: null as never,
    files: [],
    ui: null,
  });
  const emitRound = (r: number) => {
    const record = {
      round: r,
      spySeat: 1,
      rewards: { summary: [0.5, -0.5, 0.5] },
      metrics: { spyCaught: true, voteAccuracy: 1 },
      train: { loss: 0.25, kl: null, gradNorm: 0.5, lr: 5e-5 },
      timings: { summarizeMs: 40, summaryPrefillMs: 10, voteMs: 20, updateMs: 30, totalMs: 60 },
    } as unknown as RoundRecord;
    onEvent!({
      type: 'round-start',
      round: r,
      documentId: 'a',
      fullText: doc.report,
      spyText: 'The agency audited its programs.',
      span: { charStart: 32, charEnd: 47 },
      spyMarkAt: 32,
      cut: null,
      groupSize: 3,
      labels: [2, 1, 3],
      spySeat: 1,
    });
    onEvent!({ type: 'round-done', round: r, record, tokensPerSecond: 10, seconds: 0.1 });
  };
  const engine = {
    async startRun(_o: unknown, cb: (e: TrainEvent) => void) {
      calls.push('startRun');
      onEvent = cb;
      if (startGate) await startGate;
      if (failStart) throw failStart;
      return { round };
    },
    async step() {
      calls.push('step');
      await new Promise<void>((resolve) => gates.push(resolve));
      if (failNext) {
        const e = failNext;
        failNext = null;
        throw e;
      }
      const r = round++;
      if (opts.eventsAfterReply) setTimeout(() => emitRound(r), 30);
      else emitRound(r);
      return { round, record: null as never };
    },
    async autosave() {
      calls.push('autosave');
      return meta();
    },
    async resetRun() {
      calls.push('resetRun');
      round = 0;
    },
    async savedRun() {
      return null;
    },
  };
  return {
    engine,
    calls,
    /** Resolves once a round is in flight (the engine's step was called and waits). */
    async inFlight() {
      await vi.waitFor(() => expect(gates.length, 'a round in flight').toBeGreaterThan(0));
    },
    /** Lets the round in flight end (waits until one is in flight). */
    async endRound() {
      await this.inFlight();
      gates.shift()!();
    },
    failNextRound(e: Error) {
      failNext = e;
    },
    failStart(e: Error) {
      failStart = e;
    },
    holdStart() {
      let release!: () => void;
      startGate = new Promise((r) => (release = r));
      return release;
    },
  };
}

const model = { name: 'tiny', ref: { kind: 'demo' } } as LoadedModelInfo;

async function makeStore(engine: unknown, callback: <F>(f: F) => F = (f) => f) {
  const store = createAppStore({
    engine: engine as EngineApi,
    callback: callback as never,
    hasWebGpu: true,
    loadBundledDocuments: async () => ({ train: [doc], eval: [] }),
    saveFile: () => undefined,
  });
  await store.getState().loadBundled();
  store.setState({ model });
  return store;
}

/** Every status the store takes, in order. */
function statusesOf(store: AppStore): RunStatus[] {
  const seen: RunStatus[] = [];
  store.subscribe((s, prev) => void (s.runStatus !== prev.runStatus && seen.push(s.runStatus)));
  return seen;
}

describe('run slice', () => {
  it('Step creates the trainer, plays one round and autosaves', async () => {
    const e = scriptedEngine();
    const store = await makeStore(e.engine);
    const seen = statusesOf(store);
    const done = store.getState().step();
    await e.endRound();
    await done;
    expect(seen).toEqual(['starting', 'paused', 'stepping', 'paused']);
    expect(store.getState()).toMatchObject({ round: 1, runError: null, resetPending: false });
    expect(store.getState().series.rounds).toHaveLength(1);
    expect(e.calls).toEqual(['startRun', 'step', 'autosave']);
  });

  it('Start plays rounds back to back; Pause stops after the round in flight; Start while pausing plays on', async () => {
    const e = scriptedEngine();
    const store = await makeStore(e.engine);
    const s = () => store.getState();
    const seen = statusesOf(store);
    const playing = s().start();
    await e.endRound();
    await e.inFlight(); // round 2
    s().pause();
    expect(s().runStatus).toBe('pausing');
    void s().start(); // changed my mind: the loop that is still going plays on
    expect(s().runStatus).toBe('running');
    await e.endRound();
    await e.inFlight(); // round 3
    s().pause();
    await e.endRound();
    await playing;
    expect(s().runStatus).toBe('paused');
    expect(s().round).toBe(3);
    expect(seen).toEqual(['starting', 'paused', 'running', 'pausing', 'running', 'pausing', 'paused']);
    // One loop played the three rounds; checkpointEvery (20) is not due, so the one autosave is the pause's.
    expect(e.calls).toEqual(['startRun', 'step', 'step', 'step', 'autosave']);
  });

  it('Reset during a round waits for it, then drops the run; Start while that reset is pending does not cancel it', async () => {
    const e = scriptedEngine();
    const store = await makeStore(e.engine);
    const s = () => store.getState();
    const playing = s().start();
    await e.endRound();
    await e.inFlight();
    await s().reset();
    expect(s()).toMatchObject({ runStatus: 'pausing', resetPending: true });
    void s().start();
    expect(s().runStatus).toBe('pausing');
    await e.endRound();
    await playing;
    expect(s()).toMatchObject({ runStatus: 'none', round: 0, resetPending: false, saved: null, runError: null });
    expect(s().series.rounds).toEqual([]);
    expect(e.calls.at(-1)).toBe('resetRun');
  });

  it('Reset while the trainer is being created resets once it is ready, without playing', async () => {
    const e = scriptedEngine();
    const release = e.holdStart();
    const store = await makeStore(e.engine);
    const s = () => store.getState();
    const playing = s().start();
    await vi.waitFor(() => expect(s().runStatus).toBe('starting'));
    await s().reset();
    expect(s()).toMatchObject({ runStatus: 'starting', resetPending: true });
    release();
    await playing;
    expect(s()).toMatchObject({ runStatus: 'none', resetPending: false });
    expect(e.calls).toEqual(['startRun', 'resetRun']);
  });

  it('a trainer that cannot be created leaves no run and says why', async () => {
    const e = scriptedEngine();
    e.failStart(new Error('no model loaded: load one first'));
    const store = await makeStore(e.engine);
    await store.getState().step();
    expect(store.getState()).toMatchObject({
      runStatus: 'none',
      runError: 'Could not start the run: no model loaded: load one first',
    });
  });

  it('a failed round pauses with the error (a pending reset is dropped); Step plays it again', async () => {
    const e = scriptedEngine();
    const store = await makeStore(e.engine);
    const s = () => store.getState();
    const playing = s().start();
    e.failNextRound(new Error('shader compile failed'));
    await e.inFlight();
    await s().reset();
    expect(s()).toMatchObject({ runStatus: 'pausing', resetPending: true });
    await e.endRound();
    await playing;
    expect(s()).toMatchObject({
      runStatus: 'paused',
      resetPending: false,
      runError: 'Round 1 failed: shader compile failed',
    });
    const stepping = s().step();
    await e.endRound();
    await stepping;
    expect(s()).toMatchObject({ runStatus: 'paused', round: 1, runError: null });
  });

  it("waits for a round's events when the step's reply overtakes them", async () => {
    const e = scriptedEngine({ eventsAfterReply: true });
    const store = await makeStore(e.engine);
    const s = () => store.getState();
    const rounds: number[] = [];
    store.subscribe((st, prev) => void (st.round !== prev.round && rounds.push(st.series.rounds.length)));
    const stepping = s().step();
    await e.endRound();
    await stepping;
    // When `round` became 1, the chart already had that round's point.
    expect(rounds).toEqual([1]);
    expect(s().roundsState.rounds[0]?.done).toBe(true);
  });
});

describe('run slice over comlink', () => {
  const ports: { close(): void }[] = [];
  afterEach(() => {
    for (const p of ports.splice(0)) p.close();
  });

  it('a GpuDeviceLostError in the worker marks the run lost (by its kind, not its message); Reset then clears it', async () => {
    registerErrorTransfer();
    const e = scriptedEngine();
    const { port1, port2 } = new MessageChannel();
    ports.push(port1, port2);
    Comlink.expose(e.engine, port1 as unknown as Comlink.Endpoint);
    const remote = Comlink.wrap(port2 as unknown as Comlink.Endpoint);
    const store = await makeStore(remote, Comlink.proxy as never);
    const s = () => store.getState();

    const first = s().step();
    await e.endRound();
    await first;
    expect(s()).toMatchObject({ runStatus: 'paused', round: 1 });

    // A message that does not say "lost" at all: only the typed kind can tell.
    e.failNextRound(new GpuDeviceLostError('GPU gone: reason unknown', 'unknown'));
    const second = s().step();
    await e.endRound();
    await second;
    expect(s().runStatus).toBe('lost');
    expect(s().runError).toBe(
      'The GPU device was lost (GPU gone: reason unknown). Reload the model to continue from the last autosave.',
    );
    await s().reset();
    expect(s().runStatus).toBe('none');
  });

  it('an ordinary error from the worker is not a lost device, even when its message says so', async () => {
    registerErrorTransfer();
    const e = scriptedEngine();
    const { port1, port2 } = new MessageChannel();
    ports.push(port1, port2);
    Comlink.expose(e.engine, port1 as unknown as Comlink.Endpoint);
    const store = await makeStore(Comlink.wrap(port2 as unknown as Comlink.Endpoint), Comlink.proxy as never);
    e.failNextRound(new Error('the document says the device was lost'));
    const stepping = store.getState().step();
    await e.endRound();
    await stepping;
    expect(store.getState()).toMatchObject({
      runStatus: 'paused',
      runError: 'Round 1 failed: the document says the device was lost',
    });
  });
});
