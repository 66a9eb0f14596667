import { readdir, stat } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { errorMessage } from '@stageml/ir';
import { PeftCode, PeftError } from './errors.js';

/** One adapter directory found by `findAdapterDirs`: its name (the directory's) and path. */
export interface AdapterDir {
  readonly name: string;
  readonly dir: string;
}

async function isFile(p: string): Promise<boolean> {
  try {
    return (await stat(p)).isFile();
  } catch {
    return false;
  }
}

/**
 * The adapters `dir` names: `dir` itself when it is one adapter directory (it holds
 * `adapter_config.json`), else its subdirectories, sorted by name (each then loaded as an adapter,
 * so a subdirectory that is not one is an error there, not skipped). An unreadable `dir` is
 * `PEFT_IO`; a directory with neither is `PEFT_BAD_CONFIG` saying what was expected.
 */
export async function findAdapterDirs(dir: string): Promise<AdapterDir[]> {
  if (await isFile(join(dir, 'adapter_config.json'))) return [{ name: basename(resolve(dir)), dir }];
  let names: string[];
  try {
    names = (await readdir(dir, { withFileTypes: true }))
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
  } catch (e) {
    throw new PeftError(PeftCode.IO, `cannot list adapters in '${dir}': ${errorMessage(e)}`, { cause: e });
  }
  if (names.length === 0) {
    throw new PeftError(PeftCode.BAD_CONFIG, `'${dir}' is neither an adapter directory (no adapter_config.json) nor a directory of adapter directories`, {
      hint: 'pass a PEFT adapter directory, or a directory whose subdirectories are adapters',
    });
  }
  return names.map((name) => ({ name, dir: join(dir, name) }));
}
