// `node scripts/build-cpu-prebuilt.mjs`: rebuilds the cpu-native addon's prebuilt linux-x64 files
// (packages/runtime/native/cpu/prebuilt/linux-x64/) from packages/runtime/native/cpu/stageml_cpu.cpp,
// one per instruction-set variant, and writes manifest.json beside them: the source's SHA-256 (a
// test fails when the source changes without a rebuild), each file's SHA-256, flags and the CPU
// flags it needs (what src/native/addon.ts checks against /proc/cpuinfo at load). libstdc++ and
// libgcc are linked statically, so a machine with only Node (glibc ≥ the builder's) loads them.
// Needs g++ (CXX picks another) on linux-x64; run it after every change to the C++ source.
import { execFileSync } from 'node:child_process';
/* global process, console */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const src = join(root, 'packages/runtime/native/cpu/stageml_cpu.cpp');
const out = join(root, 'packages/runtime/native/cpu/prebuilt/linux-x64');
const cxx = process.env.CXX ?? 'g++';
const require = createRequire(join(root, 'packages/runtime/package.json'));
const headers = join(dirname(require.resolve('node-api-headers/package.json')), 'include');

if (process.platform !== 'linux' || process.arch !== 'x64') {
  console.error(`build-cpu-prebuilt: builds linux-x64 files and runs on linux-x64 only (this is ${process.platform}-${process.arch})`);
  process.exit(2);
}

// Best first: addon.ts loads the first variant whose `needs` are all in the CPU's flags.
const VARIANTS = [
  { isa: 'avx512-vnni', march: ['-march=x86-64-v4', '-mavx512vnni'], needs: ['avx2', 'fma', 'bmi1', 'bmi2', 'f16c', 'movbe', 'avx512f', 'avx512bw', 'avx512cd', 'avx512dq', 'avx512vl', 'avx512_vnni'] },
  { isa: 'avx512', march: ['-march=x86-64-v4'], needs: ['avx2', 'fma', 'bmi1', 'bmi2', 'f16c', 'movbe', 'avx512f', 'avx512bw', 'avx512cd', 'avx512dq', 'avx512vl'] },
  { isa: 'avx2', march: ['-march=x86-64-v3'], needs: ['avx2', 'fma', 'bmi1', 'bmi2', 'f16c', 'movbe'] },
];
const COMMON = ['-O3', '-mtune=generic', '-std=c++17', '-shared', '-fPIC', '-pthread', '-fvisibility=hidden', '-Wno-maybe-uninitialized', '-static-libstdc++', '-static-libgcc', '-s'];

const sha = (buf) => createHash('sha256').update(buf).digest('hex');
const source = readFileSync(src);
const version = execFileSync(cxx, ['-dumpfullversion'], { encoding: 'utf8' }).trim();
const glibc = execFileSync('ldd', ['--version'], { encoding: 'utf8' }).split('\n')[0].match(/(\d+\.\d+)\s*$/)?.[1] ?? 'unknown';
mkdirSync(out, { recursive: true });
const files = [];
for (const v of VARIANTS) {
  const name = `stageml_cpu-${v.isa}.node`;
  const tmp = join(out, `${name}.tmp`);
  const flags = [...v.march, ...COMMON];
  process.stdout.write(`${cxx} ${flags.join(' ')} → ${name} … `);
  try {
    execFileSync(cxx, [...flags, `-I${headers}`, src, '-o', tmp], { stdio: ['ignore', 'inherit', 'inherit'] });
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
  const needed = execFileSync('readelf', ['-d', tmp], { encoding: 'utf8' }).split('\n').filter((l) => l.includes('(NEEDED)')).map((l) => /\[(.*)\]/.exec(l)?.[1]);
  const extra = needed.filter((l) => !/^(libc|libm|libpthread|libdl|ld-linux-x86-64)\.so/.test(l ?? ''));
  if (extra.length > 0) {
    rmSync(tmp, { force: true });
    throw new Error(`${name} needs ${extra.join(', ')} (only glibc's libraries may be dynamic)`);
  }
  renameSync(tmp, join(out, name));
  const data = readFileSync(join(out, name));
  files.push({ isa: v.isa, file: name, sha256: sha(data), bytes: data.length, flags, needs: v.needs });
  console.log(`${(data.length / 1024).toFixed(0)} KiB`);
}
const manifest = {
  format: 'stageml-cpu-prebuilt',
  version: 1,
  platform: 'linux-x64',
  source: 'packages/runtime/native/cpu/stageml_cpu.cpp',
  sourceSha256: sha(source),
  compiler: `${cxx} ${version}`,
  glibc,
  napiVersion: 8,
  variants: files,
};
writeFileSync(join(out, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`);
console.log(`wrote ${join(out, 'manifest.json')}`);
