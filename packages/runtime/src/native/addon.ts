import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { accessSync, constants, existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { errorMessage } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from '../errors.js';

/** Environment variable naming the directory the compiled addon is cached in. */
export const NATIVE_CACHE_ENV = 'STAGEML_NATIVE_CACHE';
/** Environment variable naming the C++ compiler (default `g++`). */
export const NATIVE_CXX_ENV = 'CXX';
/** Environment variable naming a prebuilt addon file to load instead of building one. */
export const NATIVE_ADDON_ENV = 'STAGEML_CPU_ADDON';

/** The addon's functions (native/cpu/stageml_cpu.cpp). */
export interface CpuAddon {
  compile(ints: Int32Array, floats: Float64Array, params: readonly ArrayBufferView[]): object;
  run(program: object, symbols: Float64Array, inputs: readonly ArrayBufferView[], recycle?: ArrayBuffer): Promise<[ArrayBuffer, Float64Array]>;
  threads(n: number): number;
  isa(): string;
}

const require_ = createRequire(import.meta.url);
const FLAGS = ['-O3', '-march=native', '-std=c++17', '-shared', '-fPIC', '-pthread', '-fvisibility=hidden', '-Wno-maybe-uninitialized'];

function sourcePath(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  // src/native/addon.ts (sources) or dist/index.js (the built package)
  for (const rel of ['../../native/cpu/stageml_cpu.cpp', '../native/cpu/stageml_cpu.cpp']) {
    const p = join(here, rel);
    if (existsSync(p)) return p;
  }
  throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: native/cpu/stageml_cpu.cpp is missing beside ${here}`);
}

function headersDir(): string {
  try {
    return join(dirname(require_.resolve('node-api-headers/package.json')), 'include');
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: the node-api-headers package does not resolve (${errorMessage(e)})`, { cause: e });
  }
}

function writable(dir: string): boolean {
  try {
    mkdirSync(dir, { recursive: true });
    accessSync(dir, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

function cacheDir(src: string): string {
  const env = process.env[NATIVE_CACHE_ENV];
  if (env !== undefined && env !== '') return env;
  const local = join(dirname(src), 'build');
  return writable(local) ? local : join(homedir(), '.cache', 'stageml');
}

function compilerVersion(cxx: string): string {
  try {
    return execFileSync(cxx, ['-dumpfullversion'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native needs a C++17 compiler to build its kernels once: '${cxx}' did not run (${errorMessage(e)})`, {
      hint: 'install g++ (Debian: apt-get install g++), or set CXX',
      cause: e,
    });
  }
}

let loaded: CpuAddon | undefined;

/**
 * A short identity of the addon `loadCpuAddon` loads here, without loading it: the prebuilt file
 * named by `STAGEML_CPU_ADDON`, else a hash of the kernels' source and build flags. It changes
 * whenever the kernels do, so choices measured on an older build (`selectExecutor`'s cache) are not reused.
 */
export function cpuAddonBuildId(): string {
  const prebuilt = process.env[NATIVE_ADDON_ENV];
  if (prebuilt !== undefined && prebuilt !== '') return `file ${prebuilt}`;
  try {
    return `source ${createHash('sha256').update(readFileSync(sourcePath())).update(FLAGS.join(' ')).digest('hex').slice(0, 12)}`;
  } catch {
    return 'missing';
  }
}

/**
 * The compiled addon, built on first use with the machine's C++ compiler (`CXX`, default g++;
 * `-O3 -march=native`) into `native/cpu/build` beside the source, or `STAGEML_NATIVE_CACHE`, or
 * `~/.cache/stageml` when the package directory is read-only; keyed by the source, flags, compiler,
 * CPU model and Node ABI, so a rebuild happens only when one of those changes (`STAGEML_CPU_ADDON`
 * names a prebuilt file to load instead). Concurrent first uses
 * (test workers) each build into a temporary file and rename it in place. Errors: no compiler, no
 * headers or a failed build is `RT_BACKEND_UNAVAILABLE` with the compiler's message.
 */
export function loadCpuAddon(): CpuAddon {
  if (loaded !== undefined) return loaded;
  const prebuilt = process.env[NATIVE_ADDON_ENV];
  if (prebuilt !== undefined && prebuilt !== '') return (loaded = requireAddon(prebuilt));
  const src = sourcePath();
  const cxx = process.env[NATIVE_CXX_ENV] ?? 'g++';
  const version = compilerVersion(cxx);
  const source = readFileSync(src);
  const key = createHash('sha256')
    .update(source)
    .update(FLAGS.join(' '))
    .update(`${cxx} ${version}|${cpus()[0]?.model ?? ''}|${process.versions.modules}|${process.arch}`)
    .digest('hex')
    .slice(0, 16);
  const dir = cacheDir(src);
  const out = join(dir, `stageml_cpu-${key}.node`);
  if (!existsSync(out)) {
    if (!writable(dir)) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: cannot write its build directory ${dir}`, { hint: `set ${NATIVE_CACHE_ENV} to a writable directory` });
    const tmp = `${out}.${String(process.pid)}.${String(Date.now())}.tmp`;
    try {
      execFileSync(cxx, [...FLAGS, `-I${headersDir()}`, src, '-o', tmp], { stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8' });
      renameSync(tmp, out);
    } catch (e) {
      rmSync(tmp, { force: true });
      if (e instanceof RuntimeError) throw e;
      const stderr = (e as { stderr?: string }).stderr ?? '';
      throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: building ${src} failed: ${stderr.trim().split('\n').slice(0, 8).join('\n') || errorMessage(e)}`, { cause: e });
    }
  }
  return (loaded = requireAddon(out));
}

function requireAddon(file: string): CpuAddon {
  try {
    return require_(file) as CpuAddon;
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: loading ${file} failed (${errorMessage(e)})`, { cause: e });
  }
}
