import { realpath, stat } from 'node:fs/promises';
import { isAbsolute, join, relative, resolve, sep } from 'node:path';
import { ServerCode, ServerError } from './errors.js';

/** Limits on what a runtime adapter load may read. */
export interface AdapterGuardOptions {
  /** Directories adapters may be loaded from (`--adapter-root`); empty: runtime loads are refused. */
  readonly roots: readonly string[];
  /** Largest `adapter_config.json`, in bytes (default 1 MiB). */
  readonly maxConfigBytes?: number;
  /** Largest `adapter_model.safetensors`, in bytes (default 4 GiB). */
  readonly maxWeightsBytes?: number;
}

/** Files a PEFT adapter directory must hold, and the option capping each one's size. */
const FILES = [
  ['adapter_config.json', 'maxConfigBytes', 1024 * 1024],
  ['adapter_model.safetensors', 'maxWeightsBytes', 4 * 1024 ** 3],
] as const;

function inside(path: string, root: string): boolean {
  const r = relative(root, path);
  return r === '' || (!r.startsWith('..') && !isAbsolute(r) && r.split(sep)[0] !== '..');
}

const outside = (): ServerError =>
  new ServerError(ServerCode.ADAPTER_PATH, "'lora_path' is not an adapter directory inside an allowed adapter root", { hint: 'start the server with --adapter-root DIR and load adapters from inside it' });

/**
 * Checks `loraPath` before an adapter load reads anything from it, and returns its real path:
 *
 * - the path, as written (relative paths resolve against the working directory), must lie inside
 *   one of `roots` — checked lexically first, so nothing outside a root is ever touched and the
 *   answer never tells whether an outside path exists;
 * - its real path (symlinks resolved) and the real path of each adapter file must still lie
 *   inside a root's real path: a symlink out of a root is refused like an outside path;
 * - each adapter file must be a regular file (a FIFO, socket or device is refused, never opened,
 *   so a load cannot hang on it) no larger than its cap.
 *
 * Every refusal is `SERVER_ADAPTER_PATH` with a message that names no path and quotes no file.
 * NOTE: the check runs before the load opens the files; an admin who can rewrite files inside a
 * root between the two can still race it. Roots are trusted directories, not shared scratch space.
 */
export async function checkAdapterPath(loraPath: string, opts: AdapterGuardOptions): Promise<string> {
  if (opts.roots.length === 0) {
    throw new ServerError(ServerCode.ADAPTER_PATH, 'runtime adapter loads are disabled: no adapter root is configured (start the server with --adapter-root DIR, or --adapters DIR; --enable-lora alone, even with VLLM_ALLOW_RUNTIME_LORA_UPDATING, does not open the filesystem to loads)', { hint: 'start the server with --adapter-root DIR' });
  }
  if (loraPath.includes('\0')) throw outside();
  const lexical = resolve(loraPath);
  const roots = opts.roots.map((r) => resolve(r));
  if (!roots.some((r) => inside(lexical, r))) throw outside();
  const realRoots = (await Promise.all(roots.map((r) => realpath(r).catch(() => undefined)))).filter((r): r is string => r !== undefined);
  let dir: string;
  try {
    dir = await realpath(lexical);
  } catch {
    throw new ServerError(ServerCode.ADAPTER_PATH, "'lora_path' does not name an existing adapter directory");
  }
  if (!realRoots.some((r) => inside(dir, r))) throw outside();
  if (!(await stat(dir)).isDirectory()) throw new ServerError(ServerCode.ADAPTER_PATH, "'lora_path' is not a directory");
  for (const [name, option, fallback] of FILES) {
    let file: string;
    try {
      file = await realpath(join(dir, name));
    } catch {
      throw new ServerError(ServerCode.ADAPTER_PATH, `the adapter directory has no ${name}`);
    }
    if (!realRoots.some((r) => inside(file, r))) throw outside();
    const s = await stat(file);
    if (!s.isFile()) throw new ServerError(ServerCode.ADAPTER_PATH, `${name} is not a regular file`);
    const cap = opts[option] ?? fallback;
    if (s.size > cap) throw new ServerError(ServerCode.ADAPTER_PATH, `${name} holds ${String(s.size)} bytes; the limit is ${String(cap)}`);
  }
  return dir;
}

/**
 * `message` with every occurrence of the directories in `dirs` replaced by `<lora_path>`, so load
 * errors from lower layers (which name files) reveal no server paths.
 */
export function redactPaths(message: string, dirs: readonly string[]): string {
  let m = message;
  for (const d of dirs) if (d.length > 1) m = m.split(d).join('<lora_path>');
  return m;
}

/**
 * `message` with every absolute path (`/…`, `~/…`, `C:\…`) replaced by `<path>`, whatever it names:
 * what a tenant sees. Lower layers name files by their real, absolute paths (symlinked roots
 * resolved), so every server path is covered; and because the rule does not depend on which
 * directories the server has, a path the client wrote (a guessed model name) comes back as
 * `<path>` too, confirming nothing.
 */
export function hidePaths(message: string): string {
  return message.replace(/(?<![\w.~-])(?:~|[A-Za-z]:)?[/\\][^\s'"`<>|,;)]*/g, '<path>');
}
