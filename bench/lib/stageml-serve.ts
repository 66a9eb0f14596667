// `stageml serve` (the built CLI, apps/cli/dist/bin.js) as a child process, as a user starts it:
// the flags given and nothing else but `--port 0`. Resolves once the server says it is ready, with
// its address and the executor it runs (`--executor auto`'s choice and reason, when it chose).
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { childRssMiB, stopChild } from './child.js';

/** The built CLI. */
export const CLI_BIN = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'apps', 'cli', 'dist', 'bin.js');

/** A running `stageml serve`. */
export interface StagemlServe {
  readonly proc: ChildProcess;
  /** `http://host:port`. */
  readonly base: string;
  /** The executor the server runs (its ready line). */
  readonly executor: string;
  /** The server's line `executor: NAME (why)`: `--executor auto`'s choice and its reason, as logged. */
  readonly executorLine: string | undefined;
  /** Its ready line, as printed. */
  readonly readyLine: string;
  /** Resident set size of the server, in MiB (from /proc; 0 elsewhere). */
  rssMiB(): number;
  /** SIGTERM, then waits for the exit (SIGKILL after 30 s). */
  stop(): Promise<void>;
}

/** What the server's stdout said so far: the `auto` line and the ready line with its address and executor. */
export function readServeLog(text: string): { executorLine?: string; ready?: { line: string; base: string; executor: string } } {
  const executorLine = /^executor: \S+ \(.*\)$/m.exec(text)?.[0];
  const ready = /^stageml server ready on (\S+) · .*· executor (\S+) .*$/m.exec(text);
  return { ...(executorLine === undefined ? {} : { executorLine }), ...(ready === null ? {} : { ready: { line: ready[0], base: ready[1]!, executor: ready[2]! } }) };
}

/**
 * Starts `node [nodeFlags] apps/cli/dist/bin.js serve MODEL --port 0 ...flags`; resolves once it
 * prints its ready line (at most `timeoutMs`, default 600 s: loading a 1B-parameter f32 model and
 * `auto`'s first measurement take a while on a loaded machine). Its stderr (program lines,
 * progress) is kept and shown only when it fails to start.
 */
export function startStagemlServe(model: string, flags: readonly string[], opts: { nodeFlags?: readonly string[]; timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<StagemlServe> {
  if (!existsSync(CLI_BIN)) throw new Error(`${CLI_BIN} is missing: build first (npx -y pnpm@12.4.2 turbo run build)`);
  const proc = spawn(process.execPath, [...(opts.nodeFlags ?? []), CLI_BIN, 'serve', model, '--port', '0', ...flags], { env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-20_000)));
  return new Promise((resolve, reject) => {
    const fail = (why: string): void => {
      clearTimeout(timer);
      reject(new Error(`stageml serve ${why}\n--- stdout ---\n${out}\n--- stderr (tail) ---\n${err.slice(-4000)}`));
    };
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      fail(`was not ready within ${String((opts.timeoutMs ?? 600_000) / 1000)} s`);
    }, opts.timeoutMs ?? 600_000);
    const onExit = (code: number | null, signal: NodeJS.Signals | null): void => {
      fail(`exited (${String(code ?? signal)})`);
    };
    proc.once('exit', onExit);
    proc.stdout.on('data', () => {
      const log = readServeLog(out);
      if (log.ready === undefined) return;
      clearTimeout(timer);
      proc.off('exit', onExit);
      proc.stdout.removeAllListeners('data');
      proc.stdout.resume();
      resolve({
        proc,
        base: log.ready.base,
        executor: log.ready.executor,
        executorLine: log.executorLine,
        readyLine: log.ready.line,
        rssMiB: () => childRssMiB(proc),
        stop: () => stopChild(proc, () => {
          proc.kill('SIGTERM');
        }, 30_000),
      });
    });
  });
}
