// One tab owns the run: the tab that starts or resumes a run holds a Web Lock for as long as the
// run is open (the browser releases it when the tab closes). A second tab of the app sees the
// lock held, says so, and only views the autosave read-only; it never steps, resumes or saves.

export const RUN_OWNER_LOCK = 'spyrl-run-owner';

export interface TabLock {
  /** Takes the lock if no other tab holds it; true when this tab holds it (now or already). */
  acquire(): Promise<boolean>;
  release(): void;
  /** True when another tab holds the lock. */
  heldElsewhere(): Promise<boolean>;
}

type Locks = Pick<LockManager, 'request' | 'query'>;

/** navigator.locks where the browser has it (every current browser, in secure contexts); else a lock that is always free (Node tests). */
export function defaultTabLock(
  locks: Locks | undefined = (globalThis as { navigator?: { locks?: Locks } }).navigator?.locks,
): TabLock {
  if (!locks) return { acquire: async () => true, release: () => undefined, heldElsewhere: async () => false };
  let releaseHeld: (() => void) | null = null;
  let acquiring: Promise<boolean> | null = null;
  return {
    acquire() {
      if (releaseHeld) return Promise.resolve(true);
      acquiring ??= new Promise<boolean>((resolve) => {
        void locks
          .request(RUN_OWNER_LOCK, { ifAvailable: true }, (lock) => {
            if (!lock) return resolve(false);
            resolve(true);
            return new Promise<void>((r) => (releaseHeld = r)); // held until release()
          })
          .catch(() => resolve(false));
      });
      return acquiring.finally(() => (acquiring = null));
    },
    release() {
      releaseHeld?.();
      releaseHeld = null;
    },
    async heldElsewhere() {
      if (releaseHeld) return false;
      const { held = [] } = await locks.query();
      return held.some((l) => l.name === RUN_OWNER_LOCK);
    },
  };
}

export const OTHER_TAB_MESSAGE =
  'A run is open in another tab of this app. Only that tab can play, resume or save it; here you can view its last autosave read-only.';
