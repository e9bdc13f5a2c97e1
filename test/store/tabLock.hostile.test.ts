// The run-owner Web Lock (src/store/tabLock.ts) against a minimal LockManager with the Web
// Locks semantics the app uses: exclusive, ifAvailable, held until the callback's promise settles.
import { describe, expect, it } from 'vitest';
import { defaultTabLock, RUN_OWNER_LOCK } from '../../src/store/tabLock.ts';

function fakeLocks() {
  const held = new Map<string, number>();
  let nextClient = 0;
  return {
    held,
    client() {
      const id = nextClient++;
      return {
        request(name: string, opts: { ifAvailable?: boolean }, cb: (lock: { name: string } | null) => unknown) {
          if (held.has(name)) return Promise.resolve(cb(null));
          held.set(name, id);
          return Promise.resolve(cb({ name })).finally(() => held.delete(name));
        },
        async query() {
          return { held: [...held.keys()].map((name) => ({ name })) };
        },
      } as unknown as LockManager;
    },
  };
}

describe('run-owner tab lock', () => {
  it('one tab holds the run; the other sees it held elsewhere and cannot take it until release', async () => {
    const locks = fakeLocks();
    const a = defaultTabLock(locks.client());
    const b = defaultTabLock(locks.client());
    expect(await b.heldElsewhere()).toBe(false);
    expect(await a.acquire()).toBe(true);
    expect(await a.acquire()).toBe(true); // re-entrant for the owner
    expect(locks.held.has(RUN_OWNER_LOCK)).toBe(true);
    expect(await b.heldElsewhere()).toBe(true);
    expect(await a.heldElsewhere()).toBe(false);
    expect(await b.acquire()).toBe(false);
    a.release();
    await new Promise((r) => setTimeout(r, 0));
    expect(await b.heldElsewhere()).toBe(false);
    expect(await b.acquire()).toBe(true);
    expect(await a.acquire()).toBe(false);
  });

  it('without navigator.locks (Node) the lock is always free', async () => {
    const l = defaultTabLock(undefined);
    expect(await l.acquire()).toBe(true);
    expect(await l.heldElsewhere()).toBe(false);
  });
});
