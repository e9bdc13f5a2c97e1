// The run status transition table (src/store/runStatus.ts) against the transitions written out
// here by hand: every legal one leads where the controls expect, every other pair is refused.
import { describe, expect, it } from 'vitest';
import {
  canTransition,
  IllegalTransitionError,
  isBusy,
  nextStatus,
  RUN_EVENTS,
  RUN_STATUSES,
  transition,
  type RunEvent,
  type RunStatus,
} from '../../src/store/runStatus.ts';

/** [from, event, to]: the app's run lifecycle, one line per transition (the README's table). */
const LEGAL: [RunStatus, RunEvent, RunStatus][] = [
  ['none', 'create', 'starting'],
  ['none', 'resume', 'starting'],
  ['none', 'reset', 'none'],
  ['none', 'clear', 'none'],
  ['starting', 'ready', 'paused'],
  ['starting', 'start-failed', 'none'],
  ['starting', 'clear', 'none'],
  ['paused', 'play', 'running'],
  ['paused', 'step', 'stepping'],
  ['paused', 'resume', 'starting'],
  ['paused', 'reset', 'none'],
  ['paused', 'clear', 'none'],
  ['running', 'pause', 'pausing'],
  ['running', 'round-failed', 'paused'],
  ['running', 'device-lost', 'lost'],
  ['running', 'clear', 'none'],
  ['pausing', 'play', 'running'],
  ['pausing', 'stopped', 'paused'],
  ['pausing', 'round-failed', 'paused'],
  ['pausing', 'device-lost', 'lost'],
  ['pausing', 'reset', 'none'],
  ['pausing', 'clear', 'none'],
  ['stepping', 'stopped', 'paused'],
  ['stepping', 'round-failed', 'paused'],
  ['stepping', 'device-lost', 'lost'],
  ['stepping', 'reset', 'none'],
  ['stepping', 'clear', 'none'],
  ['lost', 'reset', 'none'],
  ['lost', 'clear', 'none'],
];

const legal = new Map(LEGAL.map(([from, event, to]) => [`${from} ${event}`, to]));

describe('run status transitions', () => {
  it.each(LEGAL)('%s --%s--> %s', (from, event, to) => {
    expect(transition(from, event)).toBe(to);
    expect(nextStatus(from, event)).toBe(to);
    expect(canTransition(from, event)).toBe(true);
  });

  const illegal = RUN_STATUSES.flatMap((from) =>
    RUN_EVENTS.filter((event) => !legal.has(`${from} ${event}`)).map((event) => [from, event] as const),
  );

  it('refuses every other (status, event) pair', () => {
    // 7 statuses x 12 events, of which the 29 above are legal.
    expect(RUN_STATUSES).toHaveLength(7);
    expect(RUN_EVENTS).toHaveLength(12);
    expect(illegal).toHaveLength(7 * 12 - LEGAL.length);
    for (const [from, event] of illegal) {
      expect(canTransition(from, event), `${from} --${event}-->`).toBe(false);
      expect(nextStatus(from, event)).toBeNull();
      expect(() => transition(from, event)).toThrow(IllegalTransitionError);
    }
  });

  it.each([
    ['paused', 'pause'],
    ['running', 'play'],
    ['running', 'step'],
    ['stepping', 'play'],
    ['starting', 'play'],
    ['none', 'play'],
    ['none', 'step'],
    ['lost', 'play'],
    ['lost', 'step'],
    ['lost', 'resume'],
    ['running', 'resume'],
    ['running', 'reset'],
    ['none', 'stopped'],
    ['paused', 'device-lost'],
    ['paused', 'ready'],
  ] as [RunStatus, RunEvent][])('refuses %s --%s--> with an error naming both', (from, event) => {
    let caught: unknown;
    try {
      transition(from, event);
    } catch (e) {
      caught = e;
    }
    expect(caught).toBeInstanceOf(IllegalTransitionError);
    const err = caught as IllegalTransitionError;
    expect(err.status).toBe(from);
    expect(err.event).toBe(event);
    expect(err.message).toContain(`event '${event}' is not allowed in status '${from}'`);
    // It lists what is allowed there, so the fix is in the message.
    for (const [f, e] of LEGAL) if (f === from) expect(err.message).toContain(e);
  });

  it('plays the lifecycles the controls drive', () => {
    const run = (from: RunStatus, events: RunEvent[]) => events.reduce(transition, from);
    // Start with no trainer, Pause, then Step.
    expect(run('none', ['create', 'ready', 'play', 'pause', 'stopped', 'step', 'stopped'])).toBe('paused');
    // Pause, then Start again before the round in flight ends.
    expect(run('running', ['pause', 'play'])).toBe('running');
    // The device is lost mid-round; reloading the model clears the run, Resume brings the autosave back.
    expect(run('running', ['device-lost', 'clear', 'resume', 'ready'])).toBe('paused');
    // Reset while running: pause first, reset when the round ends.
    expect(run('running', ['pause', 'reset'])).toBe('none');
    // A trainer that cannot be created leaves no run.
    expect(run('none', ['create', 'start-failed'])).toBe('none');
  });

  it('busy is exactly the statuses with a round or a trainer on its way', () => {
    expect(RUN_STATUSES.filter(isBusy).sort()).toEqual(['pausing', 'running', 'starting', 'stepping']);
  });
});
