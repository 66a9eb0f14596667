// The published form of the leaf packages: each is built with tsup, packed with `pnpm pack`, installed
// alone (with only the tarballs of its own @stageml dependencies, offline) into a plain npm project,
// and loaded from ESM, from CommonJS `require` and from TypeScript (nodenext). Packages are ESM-only
// (Node >= 20.19 can `require` ESM), so `import` and `require` see one copy of each module.
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errorMessage } from '@stageml/ir';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const bin = (name: string): string => join(root, 'node_modules', '.bin', name);

/** Package directory name → a value export to probe. */
const PACKAGES = {
  ir: 'OPS',
  safetensors: 'SafetensorsFile',
  annotations: 'StageLattice',
  rewrite: 'rewriteGreedy',
  bundle: 'loadBundle',
} as const;
type Name = keyof typeof PACKAGES;

interface Manifest {
  readonly name: string;
  readonly version: string;
  readonly exports: Record<string, unknown>;
  readonly dependencies?: Record<string, string>;
  readonly devDependencies?: Record<string, string>;
  readonly private?: boolean;
}

function sh(cmd: string, args: readonly string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, npm_config_update_notifier: 'false' } });
    let out = '';
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (out += d.toString()));
    const timer = setTimeout(() => p.kill('SIGKILL'), 90_000);
    p.on('close', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve(out);
      else reject(new Error(`${cmd} ${args.join(' ')} (in ${cwd}) exited ${String(code)}:\n${out}`));
    });
  });
}

const manifestOf = (dir: string): Manifest => JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as Manifest;
const pkgDir = (n: string): string => join(root, 'packages', n);
const dirOf = new Map(Object.keys(PACKAGES).map((n) => [manifestOf(pkgDir(n)).name, n as Name]));

/** The @stageml packages `n` needs installed beside it (transitively). */
function stagemlDeps(n: Name, seen = new Set<Name>()): Set<Name> {
  for (const d of Object.keys(manifestOf(pkgDir(n)).dependencies ?? {})) {
    const dn = dirOf.get(d);
    if (d.startsWith('@stageml/')) expect(dn, `${n} depends on ${d}, which this test does not pack`).toBeDefined();
    if (dn !== undefined && !seen.has(dn)) {
      seen.add(dn);
      stagemlDeps(dn, seen);
    }
  }
  return seen;
}

function newestMtime(dir: string): number {
  return Math.max(
    0,
    ...readdirSync(dir, { withFileTypes: true }).map((e) => (e.isDirectory() ? newestMtime(join(dir, e.name)) : statSync(join(dir, e.name)).mtimeMs)),
  );
}

/**
 * Whether `n`'s dist is missing or older than its sources, manifest or build config: like turbo's
 * cache, a fresh build is reused (dependencies stay external in the bundle and its types).
 */
function stale(n: Name): boolean {
  const outs = ['index.js', 'index.d.ts'].map((f) => join(pkgDir(n), 'dist', f));
  if (!outs.every((f) => existsSync(f))) return true;
  const built = Math.min(...outs.map((f) => statSync(f).mtimeMs));
  const inputs = [newestMtime(join(pkgDir(n), 'src')), statSync(join(pkgDir(n), 'package.json')).mtimeMs, statSync(join(pkgDir(n), 'tsup.config.ts')).mtimeMs];
  return Math.max(...inputs) > built;
}

/** Every file path an `exports` map points at. */
function exportTargets(v: unknown): string[] {
  if (typeof v === 'string') return [v];
  if (typeof v === 'object' && v !== null) return Object.values(v).flatMap(exportTargets);
  return [];
}

const work = mkdtempSync(join(tmpdir(), 'stageml-pack-'));
const tarballs = new Map<Name, string>();
const results = new Map<Name, { esm: string; cjs: string; tsc: string }>();

beforeAll(async () => {
  const names = Object.keys(PACKAGES) as Name[];
  await Promise.all(names.filter(stale).map((n) => sh(bin('tsup'), ['--silent'], pkgDir(n))));
  const dest = join(work, 'tarballs');
  mkdirSync(dest);
  await Promise.all(names.map((n) => sh('npx', ['-y', 'pnpm@12.4.2', 'pack', '--pack-destination', dest], pkgDir(n))));
  for (const n of names) {
    const m = manifestOf(pkgDir(n));
    tarballs.set(n, join(dest, `${m.name.slice(1).replace('/', '-')}-${m.version}.tgz`));
  }
  await Promise.all(
    names.map(async (n) => {
      const project = join(work, n);
      mkdirSync(project);
      writeFileSync(join(project, 'package.json'), JSON.stringify({ name: `probe-${n}`, version: '0.0.0', private: true }));
      const tgz = [n, ...stagemlDeps(n)].map((d) => tarballs.get(d)!);
      await sh('npm', ['install', '--offline', '--no-audit', '--no-fund', '--ignore-scripts', '--no-package-lock', ...tgz], project);
      // The probes run here, all packages at once; the tests below check what they printed.
      const probe = PACKAGES[n];
      const spec = `@stageml/${n}`;
      writeFileSync(join(project, 'esm.mjs'), `import * as m from '${spec}';\nif (m.${probe} === undefined) throw new Error('no ${probe}');\nconsole.log('esm ok');\n`);
      writeFileSync(
        join(project, 'cjs.cjs'),
        `const m = require('${spec}');\nif (m.${probe} === undefined) throw new Error('no ${probe}');\n` +
          `import('${spec}').then((e) => { if (e.${probe} !== m.${probe}) throw new Error('two copies'); console.log('cjs ok'); });\n`,
      );
      writeFileSync(join(project, 'check.mts'), `import { ${probe} } from '${spec}';\nexport const probe: unknown = ${probe};\n`);
      writeFileSync(join(project, 'check.cts'), `import m = require('${spec}');\nexport const probe: unknown = m.${probe};\n`);
      writeFileSync(
        join(project, 'tsconfig.json'),
        JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', strict: true, noEmit: true, types: [] }, files: ['check.mts', 'check.cts'] }),
      );
      const run = (args: string[]): Promise<string> => sh(process.execPath, args, project).catch((e: unknown) => `FAILED ${errorMessage(e)}`);
      const [esm, cjs, tsc] = await Promise.all([run(['esm.mjs']), run(['cjs.cjs']), run([join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'])]);
      results.set(n, { esm, cjs, tsc });
    }),
  );
}, 240_000);

afterAll(() => {
  rmSync(work, { recursive: true, force: true });
});

describe.each(Object.keys(PACKAGES))('pnpm pack of @stageml/%s', (n) => {
  const installed = (): string => join(work, n, 'node_modules', '@stageml', n);

  it('publishes dist only: every exports target is in the tarball, none points at src/, no private dependency', () => {
    const m = manifestOf(installed());
    const targets = exportTargets(m.exports);
    expect(targets.length).toBeGreaterThan(0);
    for (const t of targets) {
      expect(t, `${m.name} exports ${t}`).not.toMatch(/(^|\/)src\//);
      expect(existsSync(join(installed(), t)), `${m.name}: ${t} is missing from the tarball`).toBe(true);
    }
    expect(JSON.stringify(m.exports)).not.toContain('@stageml/source');
    expect(JSON.stringify(m.exports)).not.toContain('require');
    expect(existsSync(join(installed(), 'src'))).toBe(false);
    for (const d of Object.keys({ ...m.dependencies, ...m.devDependencies })) expect(d, `${m.name} ships a dependency on private ${d}`).not.toBe('@stageml/testkit');
  });

  it('loads from ESM and from CommonJS require, as one module', () => {
    const r = results.get(n as Name)!;
    expect(r.esm.trim()).toBe('esm ok');
    expect(r.cjs.trim()).toBe('cjs ok');
  });

  it('typechecks from TypeScript with module nodenext (ESM and CommonJS importers)', () => {
    expect(results.get(n as Name)!.tsc.trim()).toBe('');
  });
});
