import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Command } from 'commander';
import { errorMessage } from '@stageml/ir';
import { parsePositiveInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import type { CliIo } from '../io.js';
import { type StreamGuard, startStreamGuard } from '../stream-guard.js';

/** Fields of the HAProxy template `deploy/haproxy/haproxy.cfg.tmpl`. */
export interface HaproxyConfigFields {
  /** Address HAProxy listens on, `host:port`. */
  readonly bind: string;
  /** Replicas as `[name, host:port]`. */
  readonly servers: readonly (readonly [string, string])[];
  /** Bounded-load factor in percent (HAProxy `hash-balance-factor`; 0 disables the bound). */
  readonly hashBalanceFactor: number;
  /** Health-check interval (HAProxy time, e.g. `500ms`). */
  readonly checkInterval?: string;
  /** Client and server timeout (HAProxy time). */
  readonly timeout?: string;
  readonly maxconn?: number;
  /** Buffer size in bytes: a request body must fit it for its `model` to be hashed. */
  readonly bufsize?: number;
}

/** Fills the `{{field}}` placeholders of the HAProxy template; an unknown or unfilled field is a usage error. */
export function renderHaproxyConfig(template: string, f: HaproxyConfigFields): string {
  const values: Record<string, string> = {
    bind: f.bind,
    servers: f.servers.map(([name, addr]) => `    server ${name} ${addr}`).join('\n'),
    hashBalanceFactor: String(f.hashBalanceFactor),
    checkInterval: f.checkInterval ?? '500ms',
    timeout: f.timeout ?? '300s',
    maxconn: String(f.maxconn ?? 4096),
    bufsize: String(f.bufsize ?? 65536),
  };
  return template.replace(/\{\{(\w+)\}\}/g, (_m, key: string) => {
    const v = values[key];
    if (v === undefined) throw new CliError(CliCode.USAGE, `the HAProxy template has an unknown field {{${key}}} (known: ${Object.keys(values).join(', ')})`);
    return v;
  });
}

/** The installed HAProxy's version (`[major, minor]`), or a `CLI_HAPROXY_MISSING` error with the install hint. */
export function checkHaproxy(bin = 'haproxy'): { version: string; major: number; minor: number } {
  const hint = 'install it: apt-get update && apt-get install -y haproxy (Debian 12 ships 2.6), or pass --haproxy <path>';
  const r = spawnSync(bin, ['-v'], { encoding: 'utf8' });
  if (r.error !== undefined || r.status !== 0) {
    throw new CliError(CliCode.HAPROXY_MISSING, `'${bin}' could not be run${r.error === undefined ? ` (exit ${String(r.status)})` : `: ${r.error.message}`}; stageml cluster needs HAProxy 2.6 or later`, { hint });
  }
  const m = /HAProxy version (\d+)\.(\d+)[^\s]*/.exec(r.stdout);
  if (m === null) throw new CliError(CliCode.HAPROXY_MISSING, `'${bin} -v' did not print an HAProxy version`, { hint });
  const [major, minor] = [Number(m[1]), Number(m[2])];
  if (major < 2 || (major === 2 && minor < 6)) throw new CliError(CliCode.HAPROXY_MISSING, `HAProxy ${m[0].slice(16)} is too old: 'balance hash' on the request body needs 2.6 or later`, { hint });
  return { version: m[0].slice(16), major, minor };
}

/** Finds `deploy/haproxy/haproxy.cfg.tmpl` in a directory above this module (the repository). */
function findTemplate(): string | undefined {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const p = join(dir, 'deploy', 'haproxy', 'haproxy.cfg.tmpl');
    if (existsSync(p)) return p;
    const up = dirname(dir);
    if (up === dir) return undefined;
    dir = up;
  }
}

/** Flags `stageml cluster` sets on each replica itself. */
const RESERVED = new Set(['--port', '--host', '--replica-name']);

interface ClusterOptions {
  replicas: number;
  port: number;
  host: string;
  haproxy: string;
  haproxyTemplate?: string;
  hashBalanceFactor: number;
  readyTimeout: number;
}

interface Replica {
  readonly name: string;
  readonly port: number;
  readonly child: ChildProcess;
  exited: boolean;
  readonly exit: Promise<void>;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function isReady(url: string): Promise<boolean> {
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
    await r.arrayBuffer();
    return r.status === 200;
  } catch {
    return false;
  }
}

function pipeLines(stream: NodeJS.ReadableStream | null, prefix: string, write: (line: string) => void): void {
  if (stream === null) return;
  let rest = '';
  stream.setEncoding('utf8');
  stream.on('data', (chunk: string) => {
    const lines = (rest + chunk).split('\n');
    rest = lines.pop() ?? '';
    for (const l of lines) write(`${prefix} ${l}`);
  });
  stream.on('end', () => {
    if (rest !== '') write(`${prefix} ${rest}`);
  });
}

/**
 * `stageml cluster`: N `stageml serve` replicas on ports P+1..P+N behind HAProxy, which hashes
 * each request's `model` onto a replica (adapter affinity, bounded load, health checks, retries);
 * in front of HAProxy a stream guard (this process) ends a stream whose replica died with an SSE
 * error event.
 * Unknown flags are passed to every replica. SIGTERM/SIGINT drain the replicas, then stop HAProxy;
 * a replica that exits is reported and not restarted.
 */
export function registerCluster(program: Command, io: CliIo): void {
  program
    .command('cluster')
    .description('run N serve replicas behind HAProxy with adapter affinity (other flags go to every replica; docs/scale-out.md)')
    .requiredOption('--replicas <n>', 'number of replicas', parsePositiveInt)
    .requiredOption('--port <n>', 'HAProxy port; replicas listen on port+1..port+N', parsePositiveInt)
    .option('--host <host>', 'address HAProxy and the replicas listen on', '127.0.0.1')
    .option('--haproxy <path>', 'the haproxy binary', 'haproxy')
    .option('--haproxy-template <file>', 'HAProxy config template (default: deploy/haproxy/haproxy.cfg.tmpl)')
    .option('--hash-balance-factor <percent>', 'bounded load: no replica takes more than this % of the mean in-flight load (0: off)', (v) => (v === '0' ? 0 : parsePositiveInt(v)), 0)
    .option('--ready-timeout <s>', 'seconds to wait for every replica to be ready', parsePositiveInt, 180)
    .allowUnknownOption()
    .allowExcessArguments()
    .action(async (opts: ClusterOptions, cmd: Command) => {
      const forwarded = cmd.args;
      const reserved = forwarded.find((a) => RESERVED.has(a.split('=')[0]!));
      if (reserved !== undefined) throw new CliError(CliCode.USAGE, `${reserved.split('=')[0]!} is set by stageml cluster for each replica; use --host/--port of cluster instead`);
      if (opts.hashBalanceFactor !== 0 && opts.hashBalanceFactor <= 100) throw new CliError(CliCode.USAGE, `--hash-balance-factor must be 0 or above 100, got ${String(opts.hashBalanceFactor)}`);
      if (opts.port + opts.replicas > 65535) throw new CliError(CliCode.USAGE, `ports ${String(opts.port)}..${String(opts.port + opts.replicas)} exceed 65535`);
      const hap = checkHaproxy(opts.haproxy);
      const templatePath = opts.haproxyTemplate ?? findTemplate();
      if (templatePath === undefined) throw new CliError(CliCode.IO, 'cannot find deploy/haproxy/haproxy.cfg.tmpl above the stageml command; pass --haproxy-template <file>');
      let template: string;
      try {
        template = readFileSync(templatePath, 'utf8');
      } catch (e) {
        throw new CliError(CliCode.IO, `cannot read '${templatePath}': ${errorMessage(e)}`, { cause: e });
      }
      const names = Array.from({ length: opts.replicas }, (_, i) => `replica-${String(i + 1)}`);
      const workDir = mkdtempSync(join(tmpdir(), 'stageml-cluster-'));
      // HAProxy listens on a unix socket of the work directory; the stream guard (this process)
      // listens on the cluster's port and relays to it (stream-guard.ts says why).
      const haproxySocket = join(workDir, 'haproxy.sock');
      const cfgPath = join(workDir, 'haproxy.cfg');
      try {
        const config = renderHaproxyConfig(template, {
          bind: haproxySocket,
          servers: names.map((n, i) => [n, `${opts.host}:${String(opts.port + i + 1)}`] as const),
          hashBalanceFactor: opts.hashBalanceFactor,
        });
        writeFileSync(cfgPath, config);
        const check = spawnSync(opts.haproxy, ['-c', '-q', '-f', cfgPath], { encoding: 'utf8' });
        if (check.status !== 0) throw new CliError(CliCode.USAGE, `HAProxy rejects the generated config ${cfgPath}: ${(check.stderr + check.stdout).trim()}`);
      } catch (e) {
        rmSync(workDir, { recursive: true, force: true });
        throw e;
      }

      // The replicas run this same stageml command (same node flags: tsx in a source checkout), in
      // their own process groups so a terminal's Ctrl-C reaches only the cluster, which drains them.
      const self = process.argv[1]!;
      let stopping = false;
      const replicas: Replica[] = names.map((name, i) => {
        const port = opts.port + i + 1;
        const child = spawn(process.execPath, [...process.execArgv, self, 'serve', ...forwarded, '--host', opts.host, '--port', String(port), '--replica-name', name], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
        pipeLines(child.stdout, `[${name}]`, io.out);
        pipeLines(child.stderr, `[${name}]`, io.err);
        const r: Replica = {
          name,
          port,
          child,
          exited: false,
          exit: new Promise<void>((resolve) => {
            child.on('exit', (code, signal) => {
              r.exited = true;
              if (!stopping) io.err(`stageml cluster: ${name} exited (${signal ?? `code ${String(code)}`}); not restarted: HAProxy sends its adapters to the other replicas`);
              resolve();
            });
          }),
        };
        return r;
      });
      let proxy: ChildProcess | undefined;
      // If this process exits unexpectedly, take the (detached) children with it.
      const onExit = (): void => {
        for (const r of replicas) if (!r.exited) r.child.kill('SIGKILL');
        if (proxy?.exitCode === null && proxy.signalCode === null) proxy.kill('SIGKILL');
      };
      process.once('exit', onExit);
      let proxyExit: Promise<void> = Promise.resolve();
      let guard: StreamGuard | undefined;
      const stopAll = async (): Promise<void> => {
        stopping = true;
        for (const r of replicas) if (!r.exited) r.child.kill('SIGTERM');
        await Promise.all(replicas.map((r) => r.exit));
        // SIGUSR1: HAProxy's soft stop (finishes what is in flight).
        if (proxy?.exitCode === null && proxy.signalCode === null) proxy.kill('SIGUSR1');
        await proxyExit;
        await guard?.close();
        process.off('exit', onExit);
        rmSync(workDir, { recursive: true, force: true });
      };

      try {
        const deadline = Date.now() + opts.readyTimeout * 1000;
        for (const r of replicas) {
          while (!(await isReady(`http://${opts.host}:${String(r.port)}/ready`))) {
            if (r.exited) throw new CliError(CliCode.CLUSTER_FAILED, `${r.name} exited before it was ready (its output is above)`);
            if (Date.now() > deadline) throw new CliError(CliCode.CLUSTER_FAILED, `${r.name} was not ready within ${String(opts.readyTimeout)} s`);
            await sleep(200);
          }
        }
        const p = spawn(opts.haproxy, ['-db', '-f', cfgPath], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
        proxy = p;
        pipeLines(p.stdout, '[haproxy]', io.out);
        pipeLines(p.stderr, '[haproxy]', io.err);
        proxyExit = new Promise<void>((resolve) => {
          p.on('exit', (code, signal) => {
            if (!stopping) io.err(`stageml cluster: haproxy exited (${signal ?? `code ${String(code)}`}); stopping the replicas`);
            resolve();
          });
        });
        try {
          guard = await startStreamGuard({ host: opts.host, port: opts.port }, { socketPath: haproxySocket });
        } catch (e) {
          throw new CliError(CliCode.LISTEN, `cannot listen on ${opts.host}:${String(opts.port)}: ${errorMessage(e)}`, { cause: e });
        }
        while (!(await isReady(`http://${opts.host}:${String(opts.port)}/ready`))) {
          if (p.exitCode !== null || p.signalCode !== null) throw new CliError(CliCode.CLUSTER_FAILED, `haproxy exited before it listened on ${opts.host}:${String(opts.port)} (its output is above)`);
          if (Date.now() > deadline) throw new CliError(CliCode.CLUSTER_FAILED, `haproxy did not answer on ${opts.host}:${String(opts.port)} within ${String(opts.readyTimeout)} s`);
          await sleep(100);
        }
      } catch (e) {
        await stopAll();
        throw e;
      }
      for (const r of replicas) io.out(`${r.name} http://${opts.host}:${String(r.port)} pid ${String(r.child.pid)}`);
      io.out(`stageml cluster ready on http://${opts.host}:${String(opts.port)} · ${String(opts.replicas)} replicas · haproxy ${hap.version} (pid ${String(proxy.pid)}) on ${haproxySocket} behind the stream guard · config ${cfgPath}`);

      let signalled = false;
      let stop: (signal: string) => void = () => undefined;
      const onTerm = (): void => {
        stop('SIGTERM');
      };
      const onInt = (): void => {
        stop('SIGINT');
      };
      const failure = await new Promise<string | undefined>((resolve) => {
        stop = (signal: string): void => {
          io.out(signalled ? `${signal}: still draining the replicas` : `${signal}: draining the replicas, then stopping haproxy…`);
          signalled = true;
          resolve(undefined);
        };
        // Handlers stay installed while draining: a second signal must not kill the cluster
        // and orphan its replicas and HAProxy.
        process.on('SIGTERM', onTerm);
        process.on('SIGINT', onInt);
        void proxyExit.then(() => {
          if (!stopping) resolve('haproxy exited');
        });
        void Promise.all(replicas.map((r) => r.exit)).then(() => {
          if (!stopping) resolve('every replica exited');
        });
      });
      await stopAll();
      process.off('SIGTERM', onTerm);
      process.off('SIGINT', onInt);
      if (failure !== undefined) throw new CliError(CliCode.CLUSTER_FAILED, `the cluster stopped: ${failure}`);
      io.out('stopped');
    });
}
