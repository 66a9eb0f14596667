import { mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';

/** Whether `path` exists (any kind of entry). */
export async function pathExists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Writes directory `dir` so that it appears complete or not at all: `fill` writes into a temporary
 * sibling directory, which then replaces `dir` by a rename. On failure the temporary directory is
 * removed and `dir` is left as it was; the error propagates.
 */
export async function writeDirAtomic(dir: string, fill: (tmp: string) => Promise<void>): Promise<void> {
  const tmp = join(dirname(dir), `.${basename(dir)}.tmp-${String(process.pid)}-${String(Date.now())}`);
  try {
    await mkdir(tmp, { recursive: true });
    await fill(tmp);
    if (await pathExists(dir)) await rm(dir, { recursive: true, force: true });
    await rename(tmp, dir);
  } catch (e) {
    await rm(tmp, { recursive: true, force: true });
    throw e;
  }
}

/** Whether `path` holds something a write would destroy: a non-empty directory or any other entry. */
export async function isOccupied(path: string): Promise<boolean> {
  try {
    const st = await stat(path);
    return !st.isDirectory() || (await readdir(path)).length > 0;
  } catch {
    return false;
  }
}

/** Writes `files` (name → text) as directory `dir` with `writeDirAtomic`. */
export async function writeFilesAtomic(dir: string, files: Readonly<Record<string, string>>): Promise<void> {
  await writeDirAtomic(dir, async (tmp) => {
    for (const [name, text] of Object.entries(files)) await writeFile(join(tmp, name), text);
  });
}
