// Node reader of the bundled GovReport sample (the repository's own copy; nothing outside it).
import { readFile } from 'node:fs/promises';
import { GOVREPORT_PATH, loadBundledGovReport, type DocumentSplit } from './documents.ts';

export const GOVREPORT_FILE = new URL(`../../${GOVREPORT_PATH}`, import.meta.url);

export function readGovReportText(): Promise<string> {
  return readFile(GOVREPORT_FILE, 'utf8');
}

export function loadGovReportNode(): Promise<DocumentSplit> {
  return loadBundledGovReport(readGovReportText);
}
