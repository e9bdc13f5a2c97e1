// The vote, animated: each vote travels from voter to suspect, tallies grow, then the spy is
// revealed with every player's reward. Honours prefers-reduced-motion; speed control and skip.
import { useEffect, useRef, useState } from 'react';
import { useApp } from '../store/hooks.ts';
import { seatsInLabelOrder, tallies, type RoundView } from '../store/rounds.ts';

const W = 640;
const H = 210;
const Y = 150;
const VOTE_MS = 900;
const REVEAL_PAUSE_MS = 500;
export const SPEEDS = [0.5, 1, 2, 4] as const;

function prefersReducedMotion(): boolean {
  return typeof matchMedia === 'function' && matchMedia('(prefers-reduced-motion: reduce)').matches;
}

/** The round the stage shows: the picked one, else the latest round that has votes (it may trail the live round). */
function useVotingRound(): RoundView | null {
  return useApp((s) => {
    const { rounds, order } = s.roundsState;
    if (s.selectedRound !== null) return rounds[s.selectedRound] ?? null;
    for (let i = order.length - 1; i >= 0; i--) if (rounds[order[i]!]!.votes.length > 0) return rounds[order[i]!]!;
    return order.length ? rounds[order.at(-1)!]! : null;
  });
}

interface Timeline {
  /** Votes that have landed. */
  landed: number;
  /** 0..1 progress of the vote in flight (index `landed`). */
  flight: number;
  revealed: boolean;
}

/** Drives the animation clock for one round; `instant` shows the end state. */
function useTimeline(view: RoundView | null, speed: number, instant: boolean): [Timeline, () => void] {
  const [now, setNow] = useState(0);
  const start = useRef<{ round: number; at: number } | null>(null);
  const [skipped, setSkipped] = useState<number | null>(null);
  const votes = view?.votes.length ?? 0;
  const ready = !!view && votes > 0;
  const round = view?.round ?? -1;
  const done = !view || instant || skipped === round;

  useEffect(() => {
    if (!ready || done) return;
    if (start.current?.round !== round) start.current = { round, at: performance.now() };
    let raf = 0;
    const tick = () => {
      setNow(performance.now());
      raf = requestAnimationFrame(tick);
    };
    raf = requestAnimationFrame(tick);
    return () => cancelAnimationFrame(raf);
  }, [ready, done, round]);

  if (!view || !ready) return [{ landed: 0, flight: 0, revealed: false }, () => setSkipped(round)];
  if (done) return [{ landed: votes, flight: 0, revealed: view.reveal !== null }, () => setSkipped(round)];
  const elapsed = start.current?.round === round ? Math.max(0, now - start.current.at) * speed : 0;
  const landed = Math.min(votes, Math.floor(elapsed / VOTE_MS));
  const flight = landed < votes ? (elapsed % VOTE_MS) / VOTE_MS : 0;
  const revealed = view.reveal !== null && landed === votes && elapsed >= votes * VOTE_MS + REVEAL_PAUSE_MS;
  return [{ landed, flight, revealed }, () => setSkipped(round)];
}

function position(view: RoundView, seat: number): number {
  const order = seatsInLabelOrder(view.labels);
  return (W * (order.indexOf(seat) + 0.5)) / order.length;
}

function arc(x1: number, x2: number): { path: string; at: (t: number) => [number, number] } {
  const cx = (x1 + x2) / 2;
  const cy = Y - 60 - Math.abs(x2 - x1) * 0.18;
  const y0 = Y - 26;
  return {
    path: `M ${x1} ${y0} Q ${cx} ${cy} ${x2} ${y0}`,
    at: (t) => [
      (1 - t) ** 2 * x1 + 2 * (1 - t) * t * cx + t ** 2 * x2,
      (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y0,
    ],
  };
}

export function VotingStage() {
  const view = useVotingRound();
  const [speed, setSpeed] = useState<number>(1);
  const browsing = useApp((s) => s.selectedRound !== null);
  const markRevealed = useApp((s) => s.markRevealed);
  const [timeline, skip] = useTimeline(view, speed, prefersReducedMotion() || browsing);
  const { landed, flight, revealed } = timeline;

  useEffect(() => {
    if (view && revealed) markRevealed(view.round);
  }, [view, revealed, markRevealed]);

  const counts = view ? tallies(view, landed) : [];
  return (
    <section className="card" role="region" aria-label="Voting">
      <div className="row spread">
        <h2>Voting{view && view.votes.length > 0 ? ` · round ${view.round + 1}` : ''}</h2>
        <div className="row tight">
          <label className="inline">
            Speed{' '}
            <select aria-label="Animation speed" value={speed} onChange={(e) => setSpeed(Number(e.target.value))}>
              {SPEEDS.map((s) => (
                <option key={s} value={s}>
                  {s}×
                </option>
              ))}
            </select>
          </label>
          <button className="secondary" onClick={skip} disabled={!view || view.votes.length === 0 || revealed}>
            Skip
          </button>
        </div>
      </div>
      {!view || view.votes.length === 0 ? (
        <p className="muted">
          {view
            ? 'The players are writing their summaries; the vote follows.'
            : 'Each player reads every summary and votes for the one it thinks came from the spy.'}
        </p>
      ) : (
        <>
          <svg viewBox={`0 0 ${W} ${H}`} className="arena" role="img" aria-label={`Votes of round ${view.round + 1}`}>
            <defs>
              <marker
                id="arrow"
                viewBox="0 0 10 10"
                refX="8"
                refY="5"
                markerWidth="6"
                markerHeight="6"
                orient="auto-start-reverse"
              >
                <path d="M 0 0 L 10 5 L 0 10 z" fill="#7a8599" />
              </marker>
            </defs>
            {view.votes.slice(0, landed).map((v, i) => {
              const a = arc(position(view, v.voterSeat), position(view, v.chosenSeat));
              return <path key={i} d={a.path} className="vote-arc" markerEnd="url(#arrow)" />;
            })}
            {landed < view.votes.length &&
              (() => {
                const v = view.votes[landed]!;
                const a = arc(position(view, v.voterSeat), position(view, v.chosenSeat));
                const [x, y] = a.at(flight);
                return (
                  <>
                    <path d={a.path} className="vote-arc pending" />
                    <circle cx={x} cy={y} r={7} className="ballot" />
                  </>
                );
              })()}
            {seatsInLabelOrder(view.labels).map((seat) => {
              const x = position(view, seat);
              const isSpy = seat === view.spySeat;
              const cls = revealed ? (isSpy ? 'spy' : 'civilian') : '';
              return (
                <g key={seat} className={`player ${cls}`}>
                  <circle cx={x} cy={Y} r={24} />
                  <text x={x} y={Y + 5} textAnchor="middle" className="label">
                    P{view.labels[seat]}
                  </text>
                  <text x={x} y={Y - 34} textAnchor="middle" className="tally">
                    {counts[seat] ? `${counts[seat]} vote${counts[seat] === 1 ? '' : 's'}` : ''}
                  </text>
                  {revealed && view.reveal && (
                    <text x={x} y={Y + 44} textAnchor="middle" className="role">
                      {isSpy ? 'Spy' : 'Civilian'} {view.reveal.rewards[seat]! >= 0 ? '+' : ''}
                      {view.reveal.rewards[seat]!.toFixed(2)}
                    </text>
                  )}
                </g>
              );
            })}
          </svg>
          <ol className="vote-list">
            {view.votes.slice(0, landed).map((v, i) => {
              const p = v.probs[v.candidateSeats.indexOf(v.chosenSeat)] ?? 0;
              return (
                <li key={i}>
                  Player {view.labels[v.voterSeat]} votes Player {view.labels[v.chosenSeat]}{' '}
                  <span className="muted">({(p * 100).toFixed(0)}% of its belief)</span>
                </li>
              );
            })}
          </ol>
          {revealed && view.reveal ? (
            <p className={`reveal ${view.reveal.caught ? 'caught' : 'escaped'}`} data-testid="reveal">
              The spy was Player {view.labels[view.spySeat]}:{' '}
              {view.reveal.caught ? 'caught by the vote.' : 'it escaped.'} Rewards (summary + vote):{' '}
              {seatsInLabelOrder(view.labels)
                .map((seat) => `Player ${view.labels[seat]} ${view.reveal!.rewards[seat]!.toFixed(2)}`)
                .join(', ')}
              .
            </p>
          ) : (
            <p className="muted">{landed < view.votes.length ? 'Votes are being cast…' : 'Counting…'}</p>
          )}
        </>
      )}
    </section>
  );
}
