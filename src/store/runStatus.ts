// The run's status as a pure transition table: every status change of the run slice
// (src/store/runSlice.ts) is an event looked up here, so the legal paths can be read in one place
// and an impossible one fails loudly instead of leaving the controls in a state nobody planned.

/**
 * none: no trainer (idle); starting: a trainer is being created or the autosave resumed;
 * paused: a trainer is ready between rounds; running: rounds back to back; pausing: stops after
 * the round in flight; stepping: one round; lost: the GPU device was lost (reload the model).
 */
export type RunStatus = 'none' | 'starting' | 'running' | 'pausing' | 'paused' | 'stepping' | 'lost';

export type RunEvent =
  /** Start or Step with no trainer: one is being created. */
  | 'create'
  /** The autosaved run is being loaded (it replaces a paused run). */
  | 'resume'
  /** The trainer was created or resumed: it waits between rounds. */
  | 'ready'
  /** Creating or resuming failed: no trainer. */
  | 'start-failed'
  /** Start: play rounds back to back (from pausing: the loop plays on). */
  | 'play'
  /** Step: play one round. */
  | 'step'
  /** Pause (or Reset while running): stop after the round in flight. */
  | 'pause'
  /** The round in flight ended and was autosaved: wait between rounds. */
  | 'stopped'
  /** A round failed (the message is shown): the trainer waits, Step retries. */
  | 'round-failed'
  /** A round failed because the GPU device was lost: only a model reload helps. */
  | 'device-lost'
  /** Reset done (after the round in flight): the worker dropped the run and its autosave. */
  | 'reset'
  /** The worker dropped the run on its own (another model loaded, or a load failed). */
  | 'clear';

export const RUN_STATUSES: readonly RunStatus[] = [
  'none',
  'starting',
  'paused',
  'running',
  'pausing',
  'stepping',
  'lost',
];

export const RUN_EVENTS: readonly RunEvent[] = [
  'create',
  'resume',
  'ready',
  'start-failed',
  'play',
  'step',
  'pause',
  'stopped',
  'round-failed',
  'device-lost',
  'reset',
  'clear',
];

/** From each status, the events it accepts and the status each leads to; anything else is illegal. */
export const RUN_TRANSITIONS: Readonly<Record<RunStatus, Readonly<Partial<Record<RunEvent, RunStatus>>>>> = {
  none: { create: 'starting', resume: 'starting', reset: 'none', clear: 'none' },
  starting: { ready: 'paused', 'start-failed': 'none', clear: 'none' },
  paused: { resume: 'starting', play: 'running', step: 'stepping', reset: 'none', clear: 'none' },
  running: { pause: 'pausing', 'round-failed': 'paused', 'device-lost': 'lost', clear: 'none' },
  pausing: {
    play: 'running',
    stopped: 'paused',
    'round-failed': 'paused',
    'device-lost': 'lost',
    reset: 'none',
    clear: 'none',
  },
  stepping: { stopped: 'paused', 'round-failed': 'paused', 'device-lost': 'lost', reset: 'none', clear: 'none' },
  lost: { reset: 'none', clear: 'none' },
};

export class IllegalTransitionError extends Error {
  constructor(
    readonly status: RunStatus,
    readonly event: RunEvent,
  ) {
    const allowed = Object.keys(RUN_TRANSITIONS[status]).join(', ');
    super(`run status: event '${event}' is not allowed in status '${status}' (allowed there: ${allowed})`);
    this.name = 'IllegalTransitionError';
  }
}

/** The status `event` leads to from `status`, or null when the table has no such transition. */
export function nextStatus(status: RunStatus, event: RunEvent): RunStatus | null {
  return RUN_TRANSITIONS[status][event] ?? null;
}

export function canTransition(status: RunStatus, event: RunEvent): boolean {
  return nextStatus(status, event) !== null;
}

/** The next status; throws IllegalTransitionError (naming both) when `event` is not legal in `status`. */
export function transition(status: RunStatus, event: RunEvent): RunStatus {
  const next = nextStatus(status, event);
  if (next === null) throw new IllegalTransitionError(status, event);
  return next;
}

/** A round or a trainer is on its way: Start, Step, Resume and model loads wait for it. */
export function isBusy(status: RunStatus): boolean {
  return status === 'starting' || status === 'running' || status === 'pausing' || status === 'stepping';
}
