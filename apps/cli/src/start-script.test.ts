// scripts/start.mjs (`pnpm start`): stopping it stops the server, whether by a signal to it or by
// the death of the package-manager process that started it (which does not forward signals).
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, test } from 'vitest';

const root = fileURLToPath(new URL('../../..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'stageml-start-'));
const started: ChildProcess[] = [];
afterAll(() => {
  for (const c of started) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

/** Spawns `node file args…` in the repository root, collecting stdout + stderr. */
function launch(file: string, args: string[]): { proc: ChildProcess; output: () => string; exited: Promise<number | null> } {
  const proc = spawn(process.execPath, [file, ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
  started.push(proc);
  let text = '';
  proc.stdout.on('data', (d: Buffer) => (text += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (text += d.toString()));
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => { resolve(code); }));
  return { proc, output: () => text, exited };
}

async function until(what: string, ok: () => boolean, ms: number): Promise<void> {
  const t0 = Date.now();
  while (!ok()) {
    if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function listening(url: string): Promise<boolean> {
  try {
    await fetch(`${url}/v1/models`);
    return true;
  } catch {
    return false;
  }
}

const readyUrl = (text: string): string | undefined => /ready on (http:\/\/\S+)/.exec(text)?.[1];

describe('pnpm start (scripts/start.mjs)', () => {
  test('SIGTERM to the start command drains and stops the server; its printed example runs', async () => {
    const run = launch('scripts/start.mjs', ['--', '--port', '0', '--executor', 'interpreter', '--api-key', 'sekret']);
    await until('the ready line', () => /try: .*\n/.test(run.output()), 90_000);
    const url = readyUrl(run.output())!;
    expect(await listening(url)).toBe(true);
    // The printed example runs as printed, the key from $KEY (double quotes: the shell expands it).
    const example = /try: (.*)\n/.exec(run.output())![1]!;
    expect(example).toContain('-H "authorization: Bearer $KEY"');
    const curl = spawnSync('sh', ['-c', example], { env: { ...process.env, KEY: 'sekret' }, encoding: 'utf8' });
    expect(curl.status).toBe(0);
    expect((JSON.parse(curl.stdout) as { choices?: unknown[] }).choices).toHaveLength(1);
    run.proc.kill('SIGTERM');
    expect(await run.exited).toBe(0);
    expect(run.output()).toContain('SIGTERM: draining in-flight requests');
    expect(run.output()).toContain('stopped');
    expect(await listening(url)).toBe(false);
  }, 120_000);

  test('the death of the package manager that ran it (which forwards nothing) stops the server', async () => {
    // Stands in for pnpm: runs the start script and ignores signals; its file name is what the
    // script recognizes a package manager by.
    const pnpm = join(dir, 'pnpm.cjs');
    writeFileSync(
      pnpm,
      `const { spawn } = require('node:child_process');
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => {});
spawn(process.execPath, ['scripts/start.mjs', '--port', '0', '--executor', 'interpreter'], { stdio: 'inherit' });
setInterval(() => {}, 1000);
`,
    );
    const run = launch(pnpm, []);
    await until('the ready line', () => readyUrl(run.output()) !== undefined, 90_000);
    const url = readyUrl(run.output())!;
    expect(await listening(url)).toBe(true);
    run.proc.kill('SIGKILL');
    await until('the server to stop', () => run.output().includes('stopped'), 20_000);
    expect(run.output()).toMatch(/start: the command that started the server \(pid \d+\) is gone; stopping the server/);
    expect(await listening(url)).toBe(false);
  }, 120_000);
});
