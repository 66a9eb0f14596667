// README command 1 installs only what serving the bundled model needs (issue #37: < 500 MB in an
// empty store): `--prod --filter @stageml/cli...`. These checks keep that install light and working:
// no heavy backend becomes a runtime dependency of the CLI's closure, and what `pnpm start` loads
// (tsx) is the CLI's own dependency, not a root dev dependency.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, test } from 'vitest';

const root = fileURLToPath(new URL('../../..', import.meta.url));

interface Manifest {
  readonly name: string;
  readonly dependencies?: Record<string, string>;
  readonly optionalDependencies?: Record<string, string>;
  readonly peerDependencies?: Record<string, string>;
  readonly peerDependenciesMeta?: Record<string, { optional?: boolean }>;
}

const manifestOf = (dir: string): Manifest => JSON.parse(readFileSync(join(root, dir, 'package.json'), 'utf8')) as Manifest;
const dirOf = (name: string): string => (name === '@stageml/cli' ? 'apps/cli' : name === '@stageml/server' ? 'apps/server' : `packages/${name.slice('@stageml/'.length)}`);

/** The CLI and every workspace package it depends on at run time. */
function closure(): Manifest[] {
  const seen = new Map<string, Manifest>();
  const visit = (name: string): void => {
    if (seen.has(name)) return;
    const m = manifestOf(dirOf(name));
    seen.set(name, m);
    for (const [dep, range] of Object.entries({ ...m.dependencies, ...m.optionalDependencies })) if (range.startsWith('workspace:')) visit(dep);
  };
  visit('@stageml/cli');
  return [...seen.values()];
}

/** Packages too heavy for the serving install (native backends, benchmark peers), each loaded lazily where used. */
const HEAVY = ['onnxruntime-node', '@tensorflow/tfjs-node', '@tensorflow/tfjs-node-gpu', 'node-llama-cpp'];

describe('README command 1 (the serving install)', () => {
  test('is a production install of the CLI and its dependencies, as scripts/start.mjs expects', () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    expect(readme).toContain('npx -y pnpm@12.4.2 install --frozen-lockfile --prod --filter @stageml/cli... && npx -y pnpm@12.4.2 start');
    expect(manifestOf('apps/cli').dependencies?.['tsx']).toBeDefined();
    expect(readFileSync(join(root, 'scripts/start.mjs'), 'utf8')).toContain('tsx-loader.mjs');
  });

  test('installs no heavy backend: each is an optional peer where it is used', () => {
    const packages = closure();
    expect(packages.map((m) => m.name)).toContain('@stageml/runtime');
    for (const m of packages) {
      for (const heavy of HEAVY) {
        expect(m.dependencies?.[heavy], `${m.name} depends on ${heavy}`).toBeUndefined();
        expect(m.optionalDependencies?.[heavy], `${m.name} has ${heavy} as an optional dependency (installed by --prod)`).toBeUndefined();
        if (m.peerDependencies?.[heavy] !== undefined) expect(m.peerDependenciesMeta?.[heavy]?.optional, `${m.name}'s peer ${heavy}`).toBe(true);
      }
    }
    expect(manifestOf('packages/runtime').peerDependencies?.['onnxruntime-node']).toBeDefined();
  });
});
