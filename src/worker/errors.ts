// Errors across the worker boundary, typed. comlink's own 'throw' handler keeps an Error's name,
// message and stack only; this one adds `kind` (src/worker/protocol.ts), read from the error's
// class where the GPU error classes live, so the page knows a lost device without matching a
// message or a class name (which minification renames). Both sides register it: the worker
// serializes what the engine throws, the page what a callback throws, and each deserializes.
import * as Comlink from 'comlink';
import { GpuDeviceLostError, GpuOutOfMemoryError, GpuUnavailableError, GpuValidationError } from '../gpu/errors.ts';
import { EngineError, errorKind, type ErrorKind, type SerializedError } from './protocol.ts';

/** What comlink hands the 'throw' handler: the thrown value, wrapped. */
interface Thrown {
  value: unknown;
}

/** The wire format: comlink's own, so either side still understands the other without this handler. */
export type SerializedThrow = { isError: true; value: SerializedError } | { isError: false; value: unknown };

/** How deep a `cause` chain is followed (a wrapped wrapped error is already unusual). */
const MAX_CAUSES = 8;

/** The kind of `e`: its own class, else the first typed class in its `cause` chain. */
export function classifyError(e: unknown): ErrorKind {
  let x: unknown = e;
  for (let depth = 0; x instanceof Error && depth < MAX_CAUSES; depth++, x = x.cause) {
    if (x instanceof GpuDeviceLostError) return 'device-lost';
    if (x instanceof GpuOutOfMemoryError) return 'out-of-memory';
    if (x instanceof GpuUnavailableError) return 'gpu-unavailable';
    if (x instanceof GpuValidationError) return 'gpu-validation';
    const kind = errorKind(x); // already typed (an EngineError passed on)
    if (kind !== 'error') return kind;
  }
  return 'error';
}

/** The GPUDeviceLostInfo.reason of a lost device in `e` or its causes. */
function lostReason(e: unknown): string | undefined {
  let x: unknown = e;
  for (let depth = 0; x instanceof Error && depth < MAX_CAUSES; depth++, x = x.cause) {
    if (x instanceof GpuDeviceLostError || x instanceof EngineError) return x.reason;
  }
  return undefined;
}

export function serializeThrown(value: unknown): SerializedThrow {
  if (!(value instanceof Error)) return { isError: false, value };
  const out: SerializedError = { name: value.name, message: value.message, kind: classifyError(value) };
  if (value.stack !== undefined) out.stack = value.stack;
  const reason = out.kind === 'device-lost' ? lostReason(value) : undefined;
  if (reason !== undefined) out.reason = reason;
  return { isError: true, value: out };
}

/** The value to throw on the receiving side: an EngineError for an Error, else the value itself. */
export function deserializeThrown(s: SerializedThrow): unknown {
  if (!s.isError) return s.value;
  // A sender without this handler sends no kind: errorKind() makes that 'error'.
  return new EngineError({ ...s.value, kind: errorKind(s.value) });
}

let registered = false;

/** Replaces comlink's 'throw' handler (same name on both sides, same test for a thrown value). */
export function registerErrorTransfer(): void {
  if (registered) return;
  const builtin = Comlink.transferHandlers.get('throw') as Comlink.TransferHandler<Thrown, SerializedThrow> | undefined;
  if (!builtin) throw new Error("comlink has no 'throw' transfer handler to replace (comlink changed?)");
  const handler: Comlink.TransferHandler<Thrown, SerializedThrow> = {
    canHandle: (v): v is Thrown => builtin.canHandle(v),
    serialize: (thrown) => [serializeThrown(thrown.value), []],
    deserialize: (s) => {
      throw deserializeThrown(s);
    },
  };
  Comlink.transferHandlers.set('throw', handler as Comlink.TransferHandler<unknown, unknown>);
  registered = true;
}
