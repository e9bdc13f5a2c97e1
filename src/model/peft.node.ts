// Node-only: puts the files of writeAdapter / writeOptimizerState into a folder on disk.
import { mkdir, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/**
 * Writes each file to `<name>.part` and renames it into place, so a crash mid-save never leaves
 * a truncated adapter or optimizer file under its real name. Read back with nodeFolderSource(dir).
 */
export async function writeFolder(dir: string, files: Readonly<Record<string, string | Uint8Array>>): Promise<void> {
  await mkdir(dir, { recursive: true });
  for (const [name, content] of Object.entries(files)) {
    const path = join(dir, name);
    await writeFile(`${path}.part`, content);
    await rename(`${path}.part`, path);
  }
}
