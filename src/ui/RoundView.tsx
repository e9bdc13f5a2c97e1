// The round on screen: the full and the spy's document side by side (removed span highlighted,
// its place marked, scrolling in step), the summary cards filling as tokens arrive, and the
// round browser.
import { useLayoutEffect, useRef } from 'react';
import { useApp, useAppShallow } from '../store/hooks.ts';
import { describeRoundTime, seatsInLabelOrder, type RoundView as Round } from '../store/rounds.ts';

/** The round the round view shows: the one picked in the browser, else the live one. */
export function useShownRound(): Round | null {
  return useApp((s) => {
    const { rounds, order } = s.roundsState;
    const n = s.selectedRound ?? order.at(-1);
    return n === undefined ? null : (rounds[n] ?? null);
  });
}

/**
 * Keeps the two panes aligned: the text before the span is identical in both, so the same
 * offset; past the span the full pane is taller by the span's height.
 */
function useScrollSync(
  full: React.RefObject<HTMLDivElement | null>,
  spy: React.RefObject<HTMLDivElement | null>,
  key: unknown,
) {
  useLayoutEffect(() => {
    const a = full.current;
    const b = spy.current;
    if (!a || !b) return;
    const markA = a.querySelector<HTMLElement>('mark');
    const markB = b.querySelector<HTMLElement>('.gap');
    let syncing: HTMLElement | null = null;
    const map = (from: HTMLElement, to: HTMLElement, fromMark: HTMLElement | null, toMark: HTMLElement | null) => {
      if (syncing === to) return; // this scroll was ours
      syncing = from;
      let top = from.scrollTop;
      if (fromMark && toMark) {
        const fTop = fromMark.offsetTop - from.offsetTop;
        const tTop = toMark.offsetTop - to.offsetTop;
        const fH = fromMark.offsetHeight;
        const tH = toMark.offsetHeight;
        if (top <= fTop) top = top + (tTop - fTop);
        else if (top >= fTop + fH) top = top - fTop - fH + tTop + tH;
        else top = tTop + ((top - fTop) / Math.max(1, fH)) * tH;
      }
      to.scrollTop = top;
      requestAnimationFrame(() => (syncing = null));
    };
    const onA = () => map(a, b, markA, markB);
    const onB = () => map(b, a, markB, markA);
    a.addEventListener('scroll', onA);
    b.addEventListener('scroll', onB);
    // Open with the removed span in view.
    if (markA) {
      a.scrollTop = Math.max(0, markA.offsetTop - a.offsetTop - a.clientHeight / 3);
      onA();
    }
    return () => {
      a.removeEventListener('scroll', onA);
      b.removeEventListener('scroll', onB);
    };
  }, [full, spy, key]);
}

export function DocumentPanes({ view }: { view: Round }) {
  const full = useRef<HTMLDivElement>(null);
  const spy = useRef<HTMLDivElement>(null);
  const cfg = useApp((s) => s.runConfig);
  useScrollSync(full, spy, `${view.round}`);
  const { charStart, charEnd } = view.span;
  const placeholder =
    cfg?.maskMode === 'placeholder' && view.spyText.startsWith(cfg.maskPlaceholder, view.spyMarkAt)
      ? cfg.maskPlaceholder
      : '';
  const removedWords = view.fullText.slice(charStart, charEnd).trim().split(/\s+/).filter(Boolean).length;
  return (
    <div className="panes">
      <div className="pane-wrap">
        <h3>Full document</h3>
        <div className="pane" role="region" aria-label="Full document" ref={full} tabIndex={0}>
          {view.fullText.slice(0, charStart)}
          <mark title="removed from the spy's copy">{view.fullText.slice(charStart, charEnd)}</mark>
          {view.fullText.slice(charEnd)}
        </div>
      </div>
      <div className="pane-wrap">
        <h3>Spy's document</h3>
        <div className="pane" role="region" aria-label="Spy's document" ref={spy} tabIndex={0}>
          {view.spyText.slice(0, view.spyMarkAt)}
          <span
            className="gap"
            title={`${removedWords} words removed here`}
            aria-label={`${removedWords} words removed here`}
          >
            {placeholder || '⟨removed⟩'}
          </span>
          {view.spyText.slice(view.spyMarkAt + placeholder.length)}
        </div>
      </div>
    </div>
  );
}

export function SummaryCards({ view }: { view: Round }) {
  const revealed = useApp((s) => s.selectedRound !== null || !!s.revealed[view.round]);
  const seats = seatsInLabelOrder(view.labels);
  return (
    <div className="cards" aria-label="Summaries">
      {seats.map((seat) => {
        const isSpy = seat === view.spySeat;
        const text = view.summaries[seat] ?? '';
        const reward = view.summaryRewards?.[seat];
        return (
          <article
            key={seat}
            className={`summary ${revealed ? (isSpy ? 'spy' : 'civilian') : ''}`}
            aria-label={`Player ${view.labels[seat]}'s summary`}
          >
            <header>
              <strong>Player {view.labels[seat]}</strong>
              {revealed && <span className={`badge ${isSpy ? 'spy' : 'civilian'}`}>{isSpy ? 'Spy' : 'Civilian'}</span>}
              {revealed && reward !== undefined && <span className="reward">summary reward {reward.toFixed(2)}</span>}
            </header>
            <p className={!view.summariesDone ? 'streaming' : ''}>
              {text || (view.summariesDone ? <em className="muted">(empty summary)</em> : '')}
            </p>
            {view.truncated[seat] && <small className="muted">cut at the token limit</small>}
          </article>
        );
      })}
    </div>
  );
}

export function RoundBrowser() {
  const order = useAppShallow((s) => s.roundsState.order);
  const selected = useApp((s) => s.selectedRound);
  const select = useApp((s) => s.selectRound);
  if (order.length === 0) return null;
  const idx = selected === null ? order.length - 1 : order.indexOf(selected);
  const go = (i: number) => select(i >= order.length - 1 ? null : order[i]!);
  return (
    <div className="browser row tight" aria-label="Past rounds">
      <button className="secondary" onClick={() => go(idx - 1)} disabled={idx <= 0} aria-label="Previous round">
        ‹
      </button>
      <select
        aria-label="Round shown"
        value={selected === null ? 'live' : String(selected)}
        onChange={(e) => select(e.target.value === 'live' ? null : Number(e.target.value))}
      >
        <option value="live">Live (round {order.at(-1)! + 1})</option>
        {[...order].reverse().map((n) => (
          <option key={n} value={n}>
            Round {n + 1}
          </option>
        ))}
      </select>
      <button className="secondary" onClick={() => go(idx + 1)} disabled={selected === null} aria-label="Next round">
        ›
      </button>
    </div>
  );
}

export function RoundPanel() {
  const view = useShownRound();
  const status = useApp((s) => s.runStatus);
  return (
    <section className="card" aria-label="Round">
      <div className="row spread">
        <h2>{view ? `Round ${view.round + 1}` : 'Round'}</h2>
        <RoundBrowser />
      </div>
      {view ? (
        <>
          <p className="muted small">
            Report <strong>{view.documentId}</strong>
            {view.cut ? `, first ${view.cut.keptTokens} of ${view.cut.totalTokens} tokens (document token budget)` : ''}
            . The highlighted span is missing from the spy's copy; the players do not know who the spy is.
          </p>
          <DocumentPanes view={view} />
          <h3>Summaries</h3>
          <SummaryCards view={view} />
          {view.time && (
            <p className="muted small" data-testid="round-time">
              {describeRoundTime(view.time, view.tokensPerSecond)}
            </p>
          )}
        </>
      ) : (
        <p className="muted">
          {status === 'none'
            ? 'Load a model and press Start (space) or Step (s) to play the first round.'
            : 'The first round is starting…'}
        </p>
      )}
    </section>
  );
}
