// The workspace's layering, checked from the sources: every package's imports are declared in its
// package.json, lowerings never depend on executors, and the dependency graph has no cycle.
import { readFileSync, readdirSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../../../', import.meta.url));

interface Manifest {
  readonly name: string;
  readonly private?: boolean;
  readonly dependencies?: Record<string, string>;
  readonly peerDependencies?: Record<string, string>;
  readonly optionalDependencies?: Record<string, string>;
  readonly devDependencies?: Record<string, string>;
}

interface Pkg {
  readonly dir: string;
  readonly manifest: Manifest;
  /** Dependencies the published code may import. */
  readonly runtime: ReadonlySet<string>;
  /** Plus devDependencies: what tests may import. */
  readonly all: ReadonlySet<string>;
}

const packages: Pkg[] = ['packages', 'apps'].flatMap((group) =>
  readdirSync(join(root, group)).map((name) => {
    const dir = join(root, group, name);
    const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as Manifest;
    const runtime = new Set([manifest.name, ...Object.keys({ ...manifest.dependencies, ...manifest.peerDependencies, ...manifest.optionalDependencies })]);
    return { dir, manifest, runtime, all: new Set([...runtime, ...Object.keys(manifest.devDependencies ?? {})]) };
  }),
);
const byName = new Map(packages.map((p) => [p.manifest.name, p]));
// Test tooling (vitest, fast-check and the private @stageml/testkit) is a root devDependency shared by
// every package's tests, so no published package lists the private testkit; the root's links to our
// other packages do not count, so a test must declare the packages it uses.
const rootManifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as Manifest;
const testTooling = Object.keys(rootManifest.devDependencies ?? {}).filter((d) => !d.startsWith('@stageml/') || d === '@stageml/testkit');

/** The bundle-format package and every code generator: none may depend on an executor. */
const LOWERINGS = ['@stageml/bundle', '@stageml/kernel-patterns', '@stageml/onnx-lower', '@stageml/mlir-lower', '@stageml/triton-gen', '@stageml/sm90-native'];
/** Packages that execute graphs (and pull in tfjs / onnxruntime). */
const EXECUTORS = ['@stageml/runtime'];

const builtins = new Set(builtinModules);

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(p);
    return /\.(ts|mts|cts)$/.test(e.name) ? [p] : [];
  });
}

/** Bare package names a file imports (static, dynamic, type-only and re-exports). */
function importedPackages(text: string): string[] {
  const out: string[] = [];
  const re = /(?:^|[\s;])(?:import|export)\s[^'";]*?from\s*['"]([^'"]+)['"]|(?:^|[\s;(])import\s*\(\s*['"]([^'"]+)['"]\s*\)|^\s*import\s*['"]([^'"]+)['"]/gm;
  for (const m of text.matchAll(re)) {
    const spec = m[1] ?? m[2] ?? m[3]!;
    if (spec.startsWith('.') || spec.startsWith('node:') || spec.startsWith('/')) continue;
    const parts = spec.split('/');
    const name = spec.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0]!;
    if (builtins.has(name)) continue;
    out.push(name);
  }
  return out;
}

/** Test code may use devDependencies: test files, type tests and test-only fixtures. */
function isTestFile(rel: string): boolean {
  return /\.test(-d)?\.ts$/.test(rel) || /(^|\/)test-(fixtures|support)\.ts$/.test(rel) || rel.split('/').includes('conformance');
}

function transitive(name: string, seen = new Set<string>()): Set<string> {
  for (const d of byName.get(name)?.runtime ?? []) {
    if (d === name || seen.has(d) || !byName.has(d)) continue;
    seen.add(d);
    transitive(d, seen);
  }
  return seen;
}

describe('workspace layering', () => {
  it('finds the packages', () => {
    expect(packages.length).toBeGreaterThanOrEqual(16);
    for (const n of [...LOWERINGS, ...EXECUTORS]) expect(byName.has(n), n).toBe(true);
  });

  it("declares every package's imports in its package.json", () => {
    const undeclared: string[] = [];
    for (const p of packages) {
      for (const file of sourceFiles(join(p.dir, 'src'))) {
        if (file === fileURLToPath(import.meta.url)) continue; // its own parser samples are not imports
        const rel = relative(p.dir, file);
        const allowed = isTestFile(rel) ? new Set([...p.all, ...testTooling]) : p.runtime;
        for (const dep of importedPackages(readFileSync(file, 'utf8'))) {
          if (!allowed.has(dep)) undeclared.push(`${p.manifest.name}: ${rel} imports ${dep}${p.all.has(dep) ? ' (only a devDependency)' : ''}`);
        }
      }
    }
    expect(undeclared).toEqual([]);
  });

  it('keeps lowerings off executors, even transitively', () => {
    for (const l of LOWERINGS) {
      const deps = transitive(l);
      for (const e of EXECUTORS) expect(deps.has(e), `${l} depends on ${e}`).toBe(false);
    }
  });

  it('has no dependency cycle (devDependencies included) and no published package depends on a private one', () => {
    const state = new Map<string, 'open' | 'done'>();
    const cycles: string[] = [];
    const visit = (n: string, path: string[]): void => {
      if (state.get(n) === 'done') return;
      if (state.get(n) === 'open') {
        cycles.push([...path.slice(path.indexOf(n)), n].join(' → '));
        return;
      }
      state.set(n, 'open');
      for (const d of byName.get(n)!.all) if (d !== n && byName.has(d)) visit(d, [...path, n]);
      state.set(n, 'done');
    };
    for (const p of packages) visit(p.manifest.name, []);
    expect(cycles).toEqual([]);
    for (const p of packages) {
      if (p.manifest.private === true) continue;
      for (const d of p.runtime) expect(byName.get(d)?.manifest.private ?? false, `${p.manifest.name} → ${d}`).toBe(false);
    }
  });

  it('parses the import forms the sources use', () => {
    const text = [
      "import { a } from '@stageml/ir';",
      "import type { B } from '@stageml/rewrite/sub';",
      "export { c } from 'zod';",
      "const m = await import('onnxruntime-node');",
      "import 'side-effect';",
      "import { readFile } from 'node:fs/promises';",
      "import { x } from './local.js';",
      "import path from 'path';",
    ].join('\n');
    expect(importedPackages(text)).toEqual(['@stageml/ir', '@stageml/rewrite', 'zod', 'onnxruntime-node', 'side-effect']);
  });
});
