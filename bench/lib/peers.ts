// The benchmarks' peer engines (node-llama-cpp) are dependencies of bench/peers, a workspace of its
// own that the repository's install skips (its prebuilt binaries for every GPU and CPU family are
// ~660 MB). `importPeer` loads one from there, installing bench/peers first when it is missing.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

/** bench/peers, the peers' own workspace. */
export const PEERS_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', 'peers');

/** The pnpm that installs bench/peers (the repository's own version). */
const PNPM = ['-y', 'pnpm@12.4.2'];

/**
 * Imports `name` from bench/peers. When bench/peers has no node_modules yet, runs
 * `npx -y pnpm@12.4.2 install --frozen-lockfile` there first (its output shown), once.
 * Errors: a failed install or a package bench/peers does not list throws naming the command.
 */
export async function importPeer<T>(name: string): Promise<T> {
  if (!existsSync(join(PEERS_DIR, 'node_modules', name))) {
    console.error(`bench: installing the peer engines in ${PEERS_DIR} (npx ${PNPM.join(' ')} install --frozen-lockfile) …`);
    const r = spawnSync('npx', [...PNPM, 'install', '--frozen-lockfile'], { cwd: PEERS_DIR, stdio: ['ignore', 'inherit', 'inherit'] });
    if (r.status !== 0) throw new Error(`bench: installing ${PEERS_DIR} failed (exit ${String(r.status ?? r.signal)}); run \`npx ${PNPM.join(' ')} install --frozen-lockfile\` there`);
  }
  const require = createRequire(join(PEERS_DIR, 'package.json'));
  let entry: string;
  try {
    entry = require.resolve(name);
  } catch (e) {
    throw new Error(`bench: ${name} does not resolve from ${PEERS_DIR} (is it in bench/peers/package.json?)`, { cause: e });
  }
  return (await import(pathToFileURL(entry).href)) as T;
}
