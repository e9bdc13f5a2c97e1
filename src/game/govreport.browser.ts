// Browser reader of the bundled GovReport sample: Vite emits the file as an asset, fetched on demand.
import url from '../../data/govreport/govreport_sample.jsonl?url';
import { loadBundledGovReport, type DocumentSplit } from './documents.ts';

export async function readGovReportText(): Promise<string> {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`cannot load the bundled GovReport sample (${res.status} ${res.statusText})`);
  return res.text();
}

export function loadGovReportBrowser(): Promise<DocumentSplit> {
  return loadBundledGovReport(readGovReportText);
}
