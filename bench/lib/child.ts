import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';

/** A bench server child process: its address, RSS sampling and stop. */
export interface ServerChild {
  readonly base: string;
  readonly executor: string;
  readonly proc: ChildProcess;
  /** Resident set size of the server process, in MiB (from /proc). */
  rssMiB(): number;
  stop(): Promise<void>;
}

/** Resident set size of a child process in MiB (from /proc); 0 once it has gone. */
export function childRssMiB(proc: ChildProcess): number {
  try {
    return Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${String(proc.pid)}/status`, 'utf8'))?.[1] ?? 0) / 1024;
  } catch {
    return 0;
  }
}

/** Stops a child: `ask` asks it to exit (a signal, an IPC disconnect), SIGKILL after `graceMs`; resolves once it has exited (at once when it already has). */
export function stopChild(proc: ChildProcess, ask: () => void, graceMs: number): Promise<void> {
  return new Promise<void>((done) => {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      done();
      return;
    }
    const kill = setTimeout(() => proc.kill('SIGKILL'), graceMs);
    proc.once('exit', () => {
      clearTimeout(kill);
      done();
    });
    ask();
  });
}

/** Starts bench/lib/serve-child.ts with `opts`; resolves once it listens (at most 120 s). */
export function startServerChild(opts: Record<string, unknown>): Promise<ServerChild> {
  const proc = spawn(process.execPath, ['--conditions=@stageml/source', '--import', 'tsx', 'bench/lib/serve-child.ts'], {
    env: { ...process.env, STAGEML_BENCH_SERVER: JSON.stringify(opts) },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error('the bench server did not start within 120 s'));
    }, 120_000);
    let buf = '';
    proc.stdout.on('data', (d: Buffer) => {
      buf += d.toString();
      const m = /listening (\S+) executor (\S+)/.exec(buf);
      if (m === null) return;
      clearTimeout(timer);
      resolve({
        base: m[1]!,
        executor: m[2]!,
        proc,
        rssMiB: () => childRssMiB(proc),
        stop: () => stopChild(proc, () => proc.kill('SIGTERM'), 10_000),
      });
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the bench server exited with ${String(code)}`));
    });
  });
}
