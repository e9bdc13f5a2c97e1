// Runs the `spyrl` command as a user would: a real process, its exit code and output.
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
export const ROOT = join(import.meta.dirname, '../..');
const BIN = join(ROOT, 'bin/spyrl.mjs');

export interface SpyrlResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Drops the Vulkan loader's XDG_RUNTIME_DIR notices, which are not ours. */
function clean(stderr: string): string {
  return stderr
    .split('\n')
    .filter((l) => l && !l.includes('XDG_RUNTIME_DIR'))
    .join('\n');
}

export async function spyrl(...args: string[]): Promise<SpyrlResult> {
  return spyrlWith({}, ...args);
}

/** As spyrl, with extra environment variables (undefined: removed); `raw` keeps stderr exactly as printed. */
export async function spyrlWith(
  opts: { env?: Record<string, string | undefined>; raw?: boolean },
  ...args: string[]
): Promise<SpyrlResult> {
  const tidy = opts.raw ? (s: string) => s : clean;
  try {
    const { stdout, stderr } = await run(process.execPath, [BIN, ...args], {
      maxBuffer: 64 << 20,
      env: { ...process.env, ...opts.env },
    });
    return { code: 0, stdout, stderr: tidy(stderr) };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: tidy(err.stderr) };
  }
}
