// Settings and documents: what the next run plays with. Every setting shows its one-line
// reason (CONFIG_FIELDS) and is checked by validateConfig as you type.
import { useState } from 'react';
import { CONFIG_FIELDS } from '../game/config.ts';
import { DOCUMENT_MAX_BYTES } from '../game/documents.ts';
import { FORM_FIELDS, PRESETS, type FormField } from '../store/configForm.ts';
import { useApp, useAppShallow } from '../store/hooks.ts';
import { selectEvalDocs, selectTrainDocs } from '../store/setupSlice.ts';

function Field({ f, locked }: { f: FormField; locked: boolean }) {
  const value = useApp((s) => s.draft[f.path]);
  const setField = useApp((s) => s.setField);
  const error = useApp((s) => (s.configResult.error?.field === f.path ? s.configResult.error.message : null));
  const id = `cfg-${f.path}`;
  const help = CONFIG_FIELDS[f.path]?.why ?? '';
  let input: React.ReactNode;
  if (f.kind === 'select') {
    input = (
      <select
        id={id}
        value={String(value)}
        disabled={locked}
        onChange={(e) => setField(f.path, e.target.value)}
        aria-describedby={`${id}-help`}
      >
        {f.options!.map((o) => (
          <option key={o}>{o}</option>
        ))}
      </select>
    );
  } else if (f.kind === 'targets') {
    const on = new Set(value as string[]);
    input = (
      <span className="targets" id={id} role="group" aria-label={f.label}>
        {f.options!.map((t) => (
          <label key={t}>
            <input
              type="checkbox"
              checked={on.has(t)}
              disabled={locked}
              onChange={(e) =>
                setField(
                  f.path,
                  f.options!.filter((x) => (x === t ? e.target.checked : on.has(x))),
                )
              }
            />
            {t.replace('_proj', '')}
          </label>
        ))}
      </span>
    );
  } else {
    input = (
      <input
        id={id}
        className="num"
        inputMode="decimal"
        value={String(value)}
        disabled={locked}
        onChange={(e) => setField(f.path, e.target.value)}
        aria-describedby={`${id}-help`}
        aria-invalid={error ? true : undefined}
      />
    );
  }
  return (
    <div className={`field ${error ? 'invalid' : ''}`}>
      {f.kind === 'targets' ? <span className="label">{f.label}</span> : <label htmlFor={id}>{f.label}</label>}
      {input}
      <small id={`${id}-help`} className="help">
        {error ?? help}
      </small>
    </div>
  );
}

export function ConfigPanel() {
  const locked = useApp((s) => s.runStatus !== 'none');
  const applyPreset = useApp((s) => s.applyPreset);
  const error = useApp((s) => s.configResult.error);
  const groups = [...new Set(FORM_FIELDS.map((f) => f.group))];
  return (
    <section className="card" aria-label="Settings">
      <h2>Settings</h2>
      <div className="row tight">
        {Object.entries(PRESETS).map(([name, p]) => (
          <button key={name} className="secondary" disabled={locked} onClick={() => applyPreset(name)} title={p.note}>
            {p.label}
          </button>
        ))}
      </div>
      {locked && <p className="muted small">Settings are fixed while a run exists: Reset to change them.</p>}
      {error && !FORM_FIELDS.some((f) => f.path === error.field) && <p className="error">{error.message}</p>}
      {groups.map((g) => (
        <fieldset key={g} className="group">
          <legend>{g}</legend>
          {FORM_FIELDS.filter((f) => f.group === g).map((f) => (
            <Field key={f.path} f={f} locked={locked} />
          ))}
        </fieldset>
      ))}
    </section>
  );
}

export function DocumentsPanel() {
  const bundled = useApp((s) => s.bundled);
  const useBundled = useApp((s) => s.useBundled);
  const setUseBundled = useApp((s) => s.setUseBundled);
  const custom = useApp((s) => s.custom);
  const addPasted = useApp((s) => s.addPasted);
  const addFiles = useApp((s) => s.addFiles);
  const remove = useApp((s) => s.removeCustom);
  const error = useApp((s) => s.docsError);
  const warnings = useApp((s) => s.docsWarnings);
  const train = useAppShallow(selectTrainDocs);
  const evalDocs = useAppShallow(selectEvalDocs);
  const locked = useApp((s) => s.runStatus !== 'none');
  const [title, setTitle] = useState('');
  const [text, setText] = useState('');
  return (
    <section className="card" aria-label="Documents">
      <h2>Documents</h2>
      <label className="choice">
        <input
          type="checkbox"
          checked={useBundled}
          disabled={locked || !bundled}
          onChange={(e) => setUseBundled(e.target.checked)}
        />
        Bundled GovReport sample{' '}
        {bundled ? (
          <span className="muted">
            ({bundled.train.length + bundled.eval.length - evalDocs.length} reports to play, {evalDocs.length} held out
            for evaluation)
          </span>
        ) : (
          <span className="muted">(loading)</span>
        )}
      </label>
      {custom.length > 0 && (
        <ul className="doclist">
          {custom.map((d) => (
            <li key={d.id}>
              <span title={d.report.slice(0, 300)}>{d.id}</span>{' '}
              <span className="muted">{d.report.length.toLocaleString('en-US')} chars</span>
              <button className="link" disabled={locked} onClick={() => remove(d.id)} aria-label={`Remove ${d.id}`}>
                Remove
              </button>
            </li>
          ))}
        </ul>
      )}
      <details>
        <summary>Add your own</summary>
        <label className="field">
          Title
          <input value={title} onChange={(e) => setTitle(e.target.value)} placeholder="my-report" disabled={locked} />
        </label>
        <label className="field">
          Report text
          <textarea rows={4} value={text} onChange={(e) => setText(e.target.value)} disabled={locked} />
        </label>
        <div className="row tight">
          <button
            className="secondary"
            disabled={locked || !text.trim()}
            onClick={() => {
              if (addPasted(title, text)) {
                setTitle('');
                setText('');
              }
            }}
          >
            Add document
          </button>
          <label className="file">
            or files (.txt, .md, .jsonl){' '}
            <input
              type="file"
              aria-label="Document files"
              accept=".txt,.md,.jsonl"
              multiple
              disabled={locked}
              onChange={(e) => {
                const files = [...(e.target.files ?? [])];
                e.target.value = '';
                if (files.length) void addFiles(files);
              }}
            />
          </label>
        </div>
        <p className="muted small">
          .jsonl: one object per line with "report" (and optional "id", "summary"); .txt/.md: the whole file is one
          report. At most {DOCUMENT_MAX_BYTES / 2 ** 20} MB per file or paste; bytes that are not UTF-8 are read as
          U+FFFD with a warning.
        </p>
      </details>
      <p className="small">
        The next run plays <strong>{train.length}</strong> reports; evaluation (ROUGE-1/2/L) uses {evalDocs.length}{' '}
        held-out reports, never played.
      </p>
      {error && (
        <p className="error" role="status">
          {error}
        </p>
      )}
      {warnings.map((w) => (
        <p key={w} className="muted small" role="note">
          Warning: {w}
        </p>
      ))}
    </section>
  );
}
