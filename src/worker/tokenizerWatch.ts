// The tokenizer watchdog, both ends. In the worker, every tokenizer call (template render,
// BPE with the checkpoint's regex) is announced to the page; on the page, a call that runs
// longer than TOKENIZER_WATCHDOG_MS stops the worker and names the file. A runaway regex or
// template loop blocks the worker's only thread, so only the page can stop it.
// No imports: the page bundle must not pull in the tokenizer.

export const WATCH_MESSAGE = 'spyrl-tokenizer-watch';
export const TOKENIZER_WATCHDOG_MS = 30_000;

export interface WatchMessage {
  type: typeof WATCH_MESSAGE;
  /** 'begin': `file` is now in charge (a nested call re-announces the outer file when it returns). */
  phase: 'begin' | 'end';
  file: string;
}

/** Worker side: a TokenizerWatch (setTokenizerWatch) that posts each change to the page. */
export function workerWatch(post: (m: WatchMessage) => void): { begin(file: string): void; end(): void } {
  return {
    begin: (file) => post({ type: WATCH_MESSAGE, phase: 'begin', file }),
    end: () => post({ type: WATCH_MESSAGE, phase: 'end', file: '' }),
  };
}

export interface WatchedWorker {
  addEventListener(type: 'message', listener: (e: MessageEvent) => void): void;
  terminate(): void;
}

/** Page side: terminates `worker` when one tokenizer call runs over `limitMs`, then calls onStop with a message naming the file. */
export function watchWorker(
  worker: WatchedWorker,
  onStop: (message: string) => void,
  limitMs = TOKENIZER_WATCHDOG_MS,
): void {
  let timer: ReturnType<typeof setTimeout> | null = null;
  let stopped = false;
  const clear = () => {
    if (timer !== null) clearTimeout(timer);
    timer = null;
  };
  worker.addEventListener('message', (e) => {
    const m = e.data as Partial<WatchMessage> | null;
    if (stopped || typeof m !== 'object' || m === null || m.type !== WATCH_MESSAGE) return;
    clear();
    if (m.phase !== 'begin') return;
    const file = String(m.file);
    timer = setTimeout(() => {
      stopped = true;
      worker.terminate();
      onStop(
        `${file}: a tokenizer call ran over ${limitMs / 1000} s (a runaway chat template or pre-tokenizer regex?), so the engine was stopped. Reload the page to start again; saved runs are kept.`,
      );
    }, limitMs);
  });
}
