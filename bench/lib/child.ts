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
        rssMiB: () => {
          const s = readFileSync(`/proc/${String(proc.pid)}/status`, 'utf8');
          return Number(/VmRSS:\s+(\d+)/.exec(s)?.[1] ?? 0) / 1024;
        },
        stop: () =>
          new Promise<void>((done) => {
            const kill = setTimeout(() => proc.kill('SIGKILL'), 10_000);
            proc.once('exit', () => {
              clearTimeout(kill);
              done();
            });
            proc.kill('SIGTERM');
          }),
      });
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the bench server exited with ${String(code)}`));
    });
  });
}
