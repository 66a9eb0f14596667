// `pnpm start [-- ARGS]`: `stageml serve` on the peft-tiny fixture, with ARGS overriding the
// defaults (`pnpm start -- --port 9000`). pnpm passes a literal `--` through; it is dropped, and a
// default is left out whenever ARGS give the same option (or a model of their own).
//
// Stopping: SIGINT and SIGTERM are forwarded to the server (SIGHUP as SIGTERM; it drains and exits, this
// process exits with it). Stopping the command that started this one also stops the server, even
// when that command does not forward signals (`npx pnpm start`: killing the top npx or pnpm process
// leaves its children running): on Linux, the package-manager processes above this one are watched
// and, once one of them is gone, the server is sent SIGTERM.
/* global process, console, setInterval, clearInterval, URL */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';

const args = process.argv.slice(2).filter((a) => a !== '--');
const given = new Set(args.filter((a) => a.startsWith('--')).map((a) => a.split('=')[0]));
const ownModel = given.has('--model') || (args.length > 0 && !args[0].startsWith('-'));
const defaults = [
  ...(ownModel ? [] : ['fixtures/peft-tiny/llama/base']),
  ...(ownModel || given.has('--served-model-name') ? [] : ['--served-model-name', 'llama']),
  ...(ownModel || given.has('--adapters') ? [] : ['--adapters', 'fixtures/peft-tiny/llama/adapters']),
  ...(given.has('--port') ? [] : ['--port', '8000']),
];
// NOTE: tsx comes from apps/cli through scripts/tsx-loader.mjs: README command 1 installs no root dev dependency.
const child = spawn(process.execPath, ['--conditions=@stageml/source', '--import', new URL('tsx-loader.mjs', import.meta.url).href, 'apps/cli/src/bin.ts', 'serve', ...(ownModel ? args : [...defaults, ...args])], { stdio: 'inherit' });
let stopping = false;
const stop = (signal) => {
  stopping = true;
  if (child.exitCode === null && child.signalCode === null) child.kill(signal);
};
// SIGHUP (the terminal closed) stops the server as SIGTERM does: draining.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => stop(signal === 'SIGHUP' ? 'SIGTERM' : signal));

/** pid → { ppid, start time, name, command line } from /proc, or undefined when it is gone. */
function proc(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the parenthesized name: state ppid … starttime is field 22.
    const close = stat.lastIndexOf(')');
    const rest = stat.slice(close + 2).split(' ');
    const name = stat.slice(stat.indexOf('(') + 1, close);
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
    return { ppid: Number(rest[1]), start: rest[19], name, cmd };
  } catch {
    return undefined;
  }
}

/**
 * The package-manager processes above this one (npm, npx, pnpm and the `sh -c` lines they run each
 * other and this script with), nearest first; stops at the first other process (the user's shell).
 */
function launchers() {
  const out = [];
  let pid = process.ppid;
  while (pid > 1) {
    const p = proc(pid);
    if (p === undefined) break;
    // `npm exec pnpm@… start`, `sh -c 'pnpm' start`, `pnpm start`, `node …/pnpm.cjs start`, `npx …`.
    const manager = /\b(npm|npx|pnpm)\b/.test(p.cmd);
    const script = (p.name === 'sh' || p.name === 'dash' || p.name === 'bash') && p.cmd.includes('scripts/start.mjs');
    if (!manager && !script) break;
    out.push({ pid, start: p.start });
    pid = p.ppid;
  }
  return out;
}

if (process.platform === 'linux') {
  const watched = launchers();
  if (watched.length > 0) {
    const timer = setInterval(() => {
      if (stopping) return;
      const gone = watched.find((w) => proc(w.pid)?.start !== w.start);
      if (gone !== undefined) {
        console.error(`start: the command that started the server (pid ${String(gone.pid)}) is gone; stopping the server`);
        stop('SIGTERM');
      }
    }, 500);
    timer.unref();
    child.on('exit', () => clearInterval(timer));
  }
}

child.on('exit', (code, signal) => {
  process.exitCode = code ?? (signal === null ? 1 : 128);
});
