// Seats, the spy, and the "Player k" labels. Seats are fixed indices 0..N-1 (the order of
// prompts and generations); labels are what agents see and are reshuffled every round, so a
// seat's position in the summary list carries no information about who the spy is.
import type { Rng } from './rng.ts';

export const MIN_GROUP_SIZE = 3;
export const MAX_GROUP_SIZE = 8;

export interface Roles {
  groupSize: number;
  spySeat: number;
  /** labels[seat] = k for "Player k"; a permutation of 1..N. */
  labels: number[];
}

export function assignRoles(groupSize: number, rng: Rng): Roles {
  if (!Number.isInteger(groupSize) || groupSize < MIN_GROUP_SIZE || groupSize > MAX_GROUP_SIZE) {
    throw new RangeError(`groupSize must be an integer in ${MIN_GROUP_SIZE}..${MAX_GROUP_SIZE}, got ${groupSize}`);
  }
  const spySeat = rng.fork('spy').int(groupSize);
  const labels = rng.fork('labels').shuffle(Array.from({ length: groupSize }, (_, i) => i + 1));
  return { groupSize, spySeat, labels };
}

export function playerName(label: number): string {
  return `Player ${label}`;
}

export function seatOfLabel(roles: Roles, label: number): number {
  const seat = roles.labels.indexOf(label);
  if (seat < 0) throw new RangeError(`no seat has label ${label}`);
  return seat;
}

/** Seats in the order their summaries are listed (Player 1, Player 2, ...). */
export function seatsByLabel(roles: Roles): number[] {
  return Array.from({ length: roles.groupSize }, (_, k) => seatOfLabel(roles, k + 1));
}
