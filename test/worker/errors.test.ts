// Typed errors across the worker boundary (src/worker/errors.ts): a GpuDeviceLostError thrown on
// one side arrives on the other with kind 'device-lost', by the serializer alone and through
// comlink over a real MessageChannel (Node's, the same structured clone a Worker uses).
import { MessageChannel } from 'node:worker_threads';
import * as Comlink from 'comlink';
import { afterEach, describe, expect, it } from 'vitest';
import {
  GpuDeviceLostError,
  GpuOutOfMemoryError,
  GpuUnavailableError,
  GpuValidationError,
} from '../../src/gpu/errors.ts';
import {
  classifyError,
  deserializeThrown,
  registerErrorTransfer,
  serializeThrown,
  type SerializedThrow,
} from '../../src/worker/errors.ts';
import { EngineError, errorKind, errorMessage, errorName } from '../../src/worker/protocol.ts';

// comlink's own handler, kept before ours replaces it: the wire format must stay readable by it.
const builtinThrow = Comlink.transferHandlers.get('throw')!;

/** What the receiving side throws for `value` thrown on the sending side, through a structured clone. */
function roundTrip(value: unknown): unknown {
  return deserializeThrown(structuredClone(serializeThrown(value)));
}

describe('the throw serializer', () => {
  it('turns a GpuDeviceLostError into an EngineError of kind device-lost, keeping name, message, stack, reason', () => {
    const lost = new GpuDeviceLostError('GPU device lost: the device was destroyed', 'destroyed');
    const got = roundTrip(lost);
    expect(got).toBeInstanceOf(EngineError);
    expect(got).toBeInstanceOf(Error);
    const e = got as EngineError;
    expect(e.kind).toBe('device-lost');
    expect(e.reason).toBe('destroyed');
    expect(e.name).toBe('GpuDeviceLostError');
    expect(e.message).toBe('GPU device lost: the device was destroyed');
    expect(e.stack).toBe(lost.stack);
    expect(errorKind(e)).toBe('device-lost');
    expect(errorName(e)).toBe('GpuDeviceLostError');
    expect(errorMessage(e)).toBe('GPU device lost: the device was destroyed');
  });

  it('finds a lost device in the cause chain of a wrapping error, whatever its message', () => {
    const inner = new GpuDeviceLostError('GPU device lost: driver reset', 'unknown');
    const wrapped = new Error('reading layer 3 from the q4 cache failed', {
      cause: new Error('read', { cause: inner }),
    });
    const e = roundTrip(wrapped) as EngineError;
    expect(e.kind).toBe('device-lost');
    expect(e.reason).toBe('unknown');
    expect(e.message).toBe('reading layer 3 from the q4 cache failed');
  });

  it('types each GPU error class, and anything else as error', () => {
    expect(classifyError(new GpuOutOfMemoryError('w: 9 bytes exceeds maxBufferSize 8'))).toBe('out-of-memory');
    expect(classifyError(new GpuUnavailableError('no adapter'))).toBe('gpu-unavailable');
    expect(classifyError(new GpuValidationError('bad binding'))).toBe('gpu-validation');
    expect(classifyError(new TypeError('x is undefined'))).toBe('error');
    // A message that merely says so is not a lost device: only the class decides.
    expect(classifyError(new Error('GPU device was lost'))).toBe('error');
    const other = roundTrip(new RangeError('round 3 failed')) as EngineError;
    expect(other).toMatchObject({ kind: 'error', name: 'RangeError', message: 'round 3 failed' });
    expect(other.reason).toBeUndefined();
  });

  it('passes a thrown non-Error value through unchanged', () => {
    expect(roundTrip('plain string')).toBe('plain string');
    expect(roundTrip({ code: 7 })).toEqual({ code: 7 });
  });

  it("keeps comlink's wire format: its own deserializer still sees the kind", () => {
    const wire = serializeThrown(new GpuDeviceLostError('GPU device lost: gone', 'destroyed'));
    let thrown: unknown;
    try {
      builtinThrow.deserialize(structuredClone(wire));
    } catch (e) {
      thrown = e;
    }
    expect(thrown).toMatchObject({ kind: 'device-lost', name: 'GpuDeviceLostError', message: 'GPU device lost: gone' });
    // And ours reads a sender without the handler (no kind) as a plain error.
    const old: SerializedThrow = { isError: true, value: { name: 'Error', message: 'old worker' } as never };
    expect(errorKind(deserializeThrown(old))).toBe('error');
  });
});

describe('through comlink over a MessageChannel', () => {
  const ports: { close(): void }[] = [];
  afterEach(() => {
    for (const p of ports.splice(0)) p.close();
  });

  function connect<T>(obj: T): Comlink.Remote<T> {
    registerErrorTransfer();
    registerErrorTransfer(); // idempotent: client.ts and engine.worker.ts may share one realm in tests
    const { port1, port2 } = new MessageChannel();
    ports.push(port1, port2);
    Comlink.expose(obj, port1 as unknown as Comlink.Endpoint);
    return Comlink.wrap<T>(port2 as unknown as Comlink.Endpoint);
  }

  it('a GpuDeviceLostError thrown by the engine rejects the page-side call with kind device-lost', async () => {
    const remote = connect({
      async step(): Promise<number> {
        throw new GpuDeviceLostError('GPU device lost: Device was destroyed.', 'destroyed');
      },
      async fine(): Promise<number> {
        return 1;
      },
      async broken(): Promise<number> {
        throw new Error('no run: start one first');
      },
    });
    expect(await remote.fine()).toBe(1);
    const e = await remote.step().then(
      () => null,
      (x: unknown) => x,
    );
    expect(e).toBeInstanceOf(EngineError);
    expect(e).toMatchObject({ kind: 'device-lost', reason: 'destroyed', name: 'GpuDeviceLostError' });
    await expect(remote.broken()).rejects.toMatchObject({ kind: 'error', message: 'no run: start one first' });
  });

  it('an error thrown by a page-side callback reaches the worker typed too', async () => {
    const remote = connect({
      async withCallback(cb: () => Promise<void>): Promise<string> {
        try {
          await cb();
          return 'no error';
        } catch (e) {
          return `${errorKind(e)}: ${errorMessage(e)}`;
        }
      },
    });
    const cb = Comlink.proxy(async () => {
      throw new GpuOutOfMemoryError('chart buffer');
    });
    expect(await remote.withCallback(cb)).toBe('out-of-memory: chart buffer');
  });
});
