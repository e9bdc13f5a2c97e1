// `spyrl eval` as a user runs it: held-out reports only (refused, with the reason, when there is
// no held-out split), base / adapter / --compare-model columns of ROUGE-1/2/L and length, and
// the per-report JSONL export.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadQwen3Config } from '../../src/model/config.ts';
import { initLora, loraConfig, writeAdapter } from '../../src/model/peft.ts';
import { writeFolder } from '../../src/model/peft.node.ts';
import { nodeFolderSource } from '../../src/model/sources.node.ts';
import { folderFiles, startLoopbackHub } from '../helpers/hubServer.ts';
import { spyrl, spyrlWith } from '../helpers/spyrl.ts';

let tmp: string, model: string, other: string, config: string, adapter: string;
beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'spyrl-evalcli-'));
  model = join(tmp, 'tiny');
  other = join(tmp, 'tiny-b');
  const tiny = [
    '--layers',
    '1',
    '--hidden',
    '32',
    '--heads',
    '2',
    '--kv-heads',
    '1',
    '--head-dim',
    '16',
    '--intermediate',
    '64',
  ];
  expect((await spyrl('tiny-model', '--out', model, ...tiny)).code).toBe(0);
  expect((await spyrl('tiny-model', '--out', other, ...tiny, '--seed', '5')).code).toBe(0);
  config = join(tmp, 'config.json');
  // Small enough for SwiftShader: a 48-token read of each report (so the reference is marked as covering more), 8-token summaries.
  await writeFile(config, JSON.stringify({ evalHeldOut: 2, evalDocTokenBudget: 48, evalSummaryMaxTokens: 8 }));
  // An adapter whose B is not zero, so it changes the model.
  const cfg = await loadQwen3Config(nodeFolderSource(model));
  const lora = loraConfig({ r: 2, alpha: 4, baseModel: model });
  const w = initLora(cfg, lora, 1);
  for (const [k, v] of w) if (k.includes('lora_B')) v.forEach((_, i) => (v[i] = Math.sin(i + 1) * 0.5));
  adapter = join(tmp, 'adapter');
  await writeFolder(adapter, { ...writeAdapter(lora, w, cfg) });
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
});

describe('spyrl eval', () => {
  it('refuses to run without a held-out split and never scores training documents', async () => {
    const docs = join(tmp, 'docs.jsonl');
    await writeFile(docs, '{"report": "One report."}\n{"report": "Another report."}\n{"report": "A third."}\n');
    const r = await spyrl('eval', '--model', model, '--docs', docs, '--config', config);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr).toBe(
      `spyrl: error: no held-out split in ${docs} (it has 3 document(s), 0 with a reference "summary"; a held-out split needs at least 2 documents and references): spyrl eval scores held-out reports only, never training documents`,
    );
    const zero = await spyrl('eval', '--model', model, '--config', config, '--held-out', '0');
    expect(zero.code).toBe(2);
    expect(zero.stderr).toMatch(
      /^spyrl: error: no held-out split in the bundled GovReport sample \(config evalHeldOut is 0\)/,
    );
  });

  it('refuses a --compare-model of another architecture, naming what differs', async () => {
    const wide = join(tmp, 'wide');
    expect(
      (
        await spyrl(
          'tiny-model',
          '--out',
          wide,
          '--layers',
          '1',
          '--hidden',
          '64',
          '--heads',
          '2',
          '--kv-heads',
          '1',
          '--head-dim',
          '16',
          '--intermediate',
          '64',
        )
      ).code,
    ).toBe(0);
    const r = await spyrl('eval', '--model', model, '--compare-model', wide, '--config', config, '--held-out', '1');
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(
      /config\.json: --compare-model must have the architecture of --model; it differs in hiddenSize 64 \(base model: 32\)/,
    );
  }, 120_000);

  it('scores base, adapter and --compare-model on the held-out reports and exports JSONL', async () => {
    const out = join(tmp, 'eval.jsonl');
    const r = await spyrl(
      'eval',
      '--model',
      model,
      '--adapter',
      adapter,
      '--compare-model',
      other,
      '--config',
      config,
      '--out',
      out,
    );
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe(
      'spyrl eval: 2 held-out reports, each read up to 48 tokens (longer: cut, reference marked as covering more), greedy summaries of at most 8 tokens, ROUGE F1 with Porter stemming',
    );
    // The bundled split with evalHeldOut 2: the shortest GAO and the shortest CRS report.
    const rows = lines.slice(1, 7).map((l) => l.split('\t'));
    expect(rows.map((c) => [c[0], c[1]])).toEqual([
      ['ccdv_govreport_test_5', 'base'],
      ['ccdv_govreport_test_5', 'adapter'],
      ['ccdv_govreport_test_5', 'compare'],
      ['CRS_R44688', 'base'],
      ['CRS_R44688', 'adapter'],
      ['CRS_R44688', 'compare'],
    ]);
    for (const c of rows) {
      expect(c.slice(2, 6).join(' ')).toMatch(/^ROUGE-1 \d\.\d{4} ROUGE-2 \d\.\d{4} ROUGE-L \d\.\d{4} tokens [1-8]$/);
      expect(c[6]).toMatch(/^first \d+ of \d+ tokens: the reference covers more than the input$/);
    }
    expect(lines.slice(7, 10).map((l) => l.split('\t').slice(0, 2).join(' '))).toEqual([
      'mean base',
      'mean adapter',
      'mean compare',
    ]);
    expect(lines[10]).toBe(`wrote 2 lines to ${out}`);

    const json = (await readFile(out, 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    expect(json.map((j) => [j.id, j.coverage])).toEqual([
      ['ccdv_govreport_test_5', 'cut'],
      ['CRS_R44688', 'cut'],
    ]);
    for (const j of json) {
      expect(Object.keys(j.results)).toEqual(['base', 'adapter', 'compare']);
      expect(j.settings).toEqual({ docTokenBudget: 48, summaryMaxTokens: 8, overflow: 'mark', stemmer: true });
      expect(j.reference.length).toBeGreaterThan(100);
    }
    // Three different models write three different greedy summaries.
    const [b, a, c] = ['base', 'adapter', 'compare'].map((k) => json.map((j) => j.results[k].summary).join('|'));
    expect(new Set([b, a, c]).size).toBe(3);
  }, 300_000);

  it('reads --compare-model OWNER/NAME[@REV] from the Hub (HF_ENDPOINT, HF_TOKEN sent to the Hub only and never printed), cached by commit', async () => {
    // A loopback Hub (test/helpers/hubServer.ts) that answers the tiny-b folder: the revision API
    // (commit sha and file list), then /resolve/{sha}/{file} (weights redirected to a CDN host).
    const SHA = 'c0ffee'.padEnd(40, '0');
    const files = await folderFiles(other);
    const hub = await startLoopbackHub({ 'test-org/tiny-b': { refs: { main: SHA }, commits: { [SHA]: files } } });
    const seen = hub.requests;
    try {
      const env = {
        HF_ENDPOINT: hub.endpoint,
        HF_TOKEN: 'hf_secret_token_123',
        HF_HUB_CACHE: join(tmp, 'hub-cache'),
      };
      const run = (compare: string, out: string) =>
        spyrlWith(
          { env },
          'eval',
          '--model',
          model,
          '--compare-model',
          compare,
          '--config',
          config,
          '--held-out',
          '1',
          '--out',
          out,
        );
      const viaHub = await run('test-org/tiny-b', join(tmp, 'hub.jsonl'));
      expect(viaHub.code, viaHub.stderr).toBe(0);
      expect(viaHub.stdout + viaHub.stderr).not.toContain('hf_secret_token_123');
      expect(seen.length).toBeGreaterThan(files.size); // the revision, then every file it read
      // The token goes to the Hub only, never to the CDN its redirects lead to.
      expect(seen.filter((r) => r.host === 'hub').every((r) => r.auth === 'Bearer hf_secret_token_123')).toBe(true);
      expect(seen.filter((r) => r.host === 'cdn').map((r) => r.auth)).toEqual([undefined]);
      expect(seen.filter((r) => r.url.includes('/resolve/')).every((r) => r.url.includes(`/resolve/${SHA}/`))).toBe(
        true,
      );
      // The same model from its folder scores the same; a second Hub run reads the cache (only the revision is asked).
      const viaDir = await run(other, join(tmp, 'dir.jsonl'));
      expect(viaDir.code, viaDir.stderr).toBe(0);
      const compare = async (f: string) =>
        (await readFile(join(tmp, f), 'utf8'))
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l).results.compare);
      expect(await compare('hub.jsonl')).toEqual(await compare('dir.jsonl'));
      seen.length = 0;
      const again = await run('test-org/tiny-b@main', join(tmp, 'hub2.jsonl'));
      expect(again.code, again.stderr).toBe(0);
      expect(seen.map((r) => r.url)).toEqual(['/api/models/test-org/tiny-b/revision/main']);
      // A repo the Hub does not have: one clear error naming it.
      const missing = await run('test-org/nope', join(tmp, 'nope.jsonl'));
      expect(missing.code).not.toBe(0);
      expect(missing.stderr).toMatch(/test-org\/nope.*HTTP 404/);
    } finally {
      await hub.close();
    }
  }, 300_000);
});
