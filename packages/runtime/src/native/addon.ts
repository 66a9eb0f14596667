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
/** Environment variable that, set to `source`, skips the shipped prebuilt files and builds from source. */
export const NATIVE_BUILD_ENV = 'STAGEML_CPU_BUILD';

/** The addon's functions (native/cpu/stageml_cpu.cpp). */
export interface CpuAddon {
  compile(ints: Int32Array, floats: Float64Array, params: readonly ArrayBufferView[]): object;
  /**
   * Runs `program`. An input may be an array of Float32Arrays, one per batch row (ABI 7), where
   * `rowInputs` lists it: row b's first positions of a position-major cache [B, S, h, d], read in
   * place (positions past a row's buffer read as zeros).
   */
  run(program: object, symbols: Float64Array, inputs: readonly (ArrayBufferView | readonly Float32Array[])[], recycle?: ArrayBuffer): Promise<[ArrayBuffer, Float64Array]>;
  /** The indices of the inputs a run of `program` may give per row: those read only as cached attention's position-major caches (ABI 7). */
  rowInputs(program: object): Int32Array;
  threads(n: number): number;
  isa(): string;
  /** The runner's ABI version (absent in addons built before it was reported: ABI 1). */
  abi?(): number;
  /**
   * The instruction profile since the last call as JSON (`{ "<kind> [shape]": [runs, ns] }`, the
   * GEMMs keyed by their shapes), and profiling turned on or off for the next runs (ABI 3).
   */
  profile?(on: boolean): string;
  /** STREAM-like probe on the pool: [read GB/s, copy GB/s, checksum] (ABI 3; see `measureMemoryBandwidth`). */
  bandwidth(bytes: number, reps: number): [number, number, number];
  /** f32 GFLOP/s of the pool's threads running register-only multiply-adds, best of `reps` passes (ABI 6; see `measureFmaPeak`). */
  fmaPeak?(reps: number): number;
  /**
   * Per row of `n` entries of `x` (`x.length / n` rows), the index of its first maximum, by
   * `firstMaxIndex`'s rule (ABI 8): the greedy picks of a step's logits (`RunOptions.argmax`).
   */
  argmax(x: Float32Array, n: number): Float64Array;
}

/**
 * The runner ABI this package's encoder (compile.ts) needs: the C++ source's `kAbi`, bumped
 * whenever instructions or exports are added (2: the MoE routing ops, reductions and iota; 3: the
 * bandwidth probe, the profiler and LORA's zeroTail flag; 4: glibc's mmap threshold fixed at load,
 * so freed large blocks leave the process, i8 values and LORA_Q, the int8 factor tables' bank
 * kernel; 5: LORA_LINEAR runs as one GEMM over K + R columns, the expand inside the output tiles; 6: the
 * few-row GEMM for 17–64 rows and the reworked gathered LoRA kernels; 7: per-row inputs, a multi-row
 * step's cached attention reading each sequence's own KV buffer in place, and `rowInputs`; 8: `argmax`, the greedy picks of a run's logits in the addon, and
 * LINEAR_MULTI / QLINEAR_MULTI, sibling linears of one input in one pool job at decode rows). An addon
 * reporting another one (a stale prebuilt or `STAGEML_CPU_ADDON` file) is not used.
 */
export const CPU_ADDON_ABI = 8;

/**
 * Why `addon` cannot run this package's programs (its ABI is not `CPU_ADDON_ABI`: an older
 * prebuilt without the newer kernels), or undefined when it can.
 */
export function addonAbiProblem(addon: Partial<CpuAddon>): string | undefined {
  const abi = typeof addon.abi === 'function' ? addon.abi() : 1;
  if (abi === CPU_ADDON_ABI) return undefined;
  return `its kernels are ABI ${String(abi)}, this package's encoder needs ABI ${String(CPU_ADDON_ABI)} (${abi < CPU_ADDON_ABI ? 'an older build, without the newer kernels' : 'a newer build'})`;
}

const require_ = createRequire(import.meta.url);
const FLAGS = ['-O3', '-march=native', '-std=c++17', '-shared', '-fPIC', '-pthread', '-fvisibility=hidden', '-Wno-maybe-uninitialized'];

/** One shipped variant (`native/cpu/prebuilt/<platform>/manifest.json`). */
export interface PrebuiltVariant {
  /** What its kernels use: `avx512-vnni`, `avx512`, `avx2`. */
  readonly isa: string;
  /** File name beside the manifest. */
  readonly file: string;
  /** SHA-256 of the file. */
  readonly sha256: string;
  /** Compiler flags it was built with. */
  readonly flags: readonly string[];
  /** CPU flags (as /proc/cpuinfo names them) it needs, all of them. */
  readonly needs: readonly string[];
}

/** The prebuilt files' manifest, written by scripts/build-cpu-prebuilt.mjs. */
export interface PrebuiltManifest {
  readonly format: 'stageml-cpu-prebuilt';
  readonly platform: string;
  /** SHA-256 of the C++ source the files were built from. */
  readonly sourceSha256: string;
  readonly compiler: string;
  /** glibc of the build machine (the oldest the files load on). */
  readonly glibc: string;
  /** Best first. */
  readonly variants: readonly PrebuiltVariant[];
}

/**
 * The first of `variants` (best first) whose needed CPU flags are all in `cpuFlags` (the `flags`
 * line of /proc/cpuinfo), or undefined when none fits.
 */
export function pickPrebuiltVariant(variants: readonly PrebuiltVariant[], cpuFlags: ReadonlySet<string>): PrebuiltVariant | undefined {
  return variants.find((v) => v.needs.every((f) => cpuFlags.has(f)));
}

/** The CPU's feature flags from /proc/cpuinfo (empty where it cannot be read). */
export function cpuFlagSet(): Set<string> {
  try {
    const line = /^flags\s*:\s*(.*)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? '';
    return new Set(line.trim().split(/\s+/));
  } catch {
    return new Set();
  }
}

/** The directory of this platform's prebuilt files beside `src` (the C++ source). */
export function prebuiltDir(src: string = sourcePath()): string {
  return join(dirname(src), 'prebuilt', `${process.platform}-${process.arch}`);
}

/** Reads the manifest in `dir`, or undefined when there is none or it is unreadable. */
export function readPrebuiltManifest(dir: string): PrebuiltManifest | undefined {
  try {
    const m = JSON.parse(readFileSync(join(dir, 'manifest.json'), 'utf8')) as { format?: unknown; variants?: unknown };
    return m.format === 'stageml-cpu-prebuilt' && Array.isArray(m.variants) ? (m as PrebuiltManifest) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The prebuilt file that fits here: this platform's manifest built from the current source (its
 * SHA-256 equal: an edited source is built instead) and the best variant the CPU's flags allow.
 * `why` says what made it not fit otherwise.
 */
function prebuiltFor(src: string, source: Buffer): { file: string; variant: PrebuiltVariant } | { why: string } {
  if (process.env[NATIVE_BUILD_ENV] === 'source') return { why: `${NATIVE_BUILD_ENV}=source` };
  const dir = prebuiltDir(src);
  const manifest = readPrebuiltManifest(dir);
  if (manifest === undefined) return { why: `no prebuilt addon for ${process.platform}-${process.arch}` };
  if (manifest.sourceSha256 !== createHash('sha256').update(source).digest('hex')) return { why: 'the prebuilt addon was built from another version of the source' };
  const variant = pickPrebuiltVariant(manifest.variants, cpuFlagSet());
  if (variant === undefined) return { why: `no prebuilt variant fits this CPU (${manifest.variants.map((v) => v.isa).join(', ')} need AVX2 at least)` };
  return { file: join(dir, variant.file), variant };
}

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
    const src = sourcePath();
    const source = readFileSync(src);
    const hit = prebuiltFor(src, source);
    if ('file' in hit) return `prebuilt ${hit.variant.isa} ${hit.variant.sha256.slice(0, 12)}`;
    return `source ${createHash('sha256').update(source).update(FLAGS.join(' ')).digest('hex').slice(0, 12)}`;
  } catch {
    return 'missing';
  }
}

/** How the loaded addon came to be: `prebuilt <isa>` (a shipped file), `source` (built here) or `file` (`STAGEML_CPU_ADDON`). */
export function cpuAddonOrigin(): string | undefined {
  return origin;
}
let origin: string | undefined;

/**
 * The addon. `STAGEML_CPU_ADDON` names a file to load. Otherwise, on a platform with prebuilt
 * files (linux-x64: `native/cpu/prebuilt/linux-x64/`, AVX2, AVX-512 and AVX-512 VNNI variants) that
 * were built from the current source, the best variant the CPU's flags (/proc/cpuinfo) allow is
 * loaded — no compiler needed. Where none fits (another platform, a CPU without AVX2, an edited
 * source, `STAGEML_CPU_BUILD=source`, or a prebuilt file that does not load, e.g. an older glibc),
 * it is built on first use with the machine's C++ compiler (`CXX`, default g++; `-O3
 * -march=native`) into `native/cpu/build` beside the source, or `STAGEML_NATIVE_CACHE`, or
 * `~/.cache/stageml` when the package directory is read-only; keyed by the source, flags, compiler,
 * CPU model and Node ABI, so a rebuild happens only when one of those changes. Every addon must
 * report the runner ABI the encoder needs (`CPU_ADDON_ABI`): a stale prebuilt is built over from
 * source, a stale `STAGEML_CPU_ADDON` file is `RT_BACKEND_UNAVAILABLE`. Concurrent first
 * uses (test workers) each build into a temporary file and rename it in place. Errors: no compiler,
 * no headers or a failed build is `RT_BACKEND_UNAVAILABLE` with the compiler's message and why no
 * prebuilt file fitted.
 */
export function loadCpuAddon(): CpuAddon {
  if (loaded !== undefined) return loaded;
  const file = process.env[NATIVE_ADDON_ENV];
  if (file !== undefined && file !== '') {
    loaded = requireAddon(file);
    origin = 'file';
    return loaded;
  }
  const src = sourcePath();
  const source = readFileSync(src);
  const hit = prebuiltFor(src, source);
  let why: string;
  if ('file' in hit) {
    try {
      const addon = require_(hit.file) as CpuAddon;
      const stale = addonAbiProblem(addon);
      if (stale === undefined) {
        loaded = addon;
        origin = `prebuilt ${hit.variant.isa}`;
        return loaded;
      }
      why = `the prebuilt ${hit.variant.file} is stale: ${stale}`;
    } catch (e) {
      why = `the prebuilt ${hit.variant.file} does not load here (${errorMessage(e)})`;
    }
  } else why = hit.why;
  try {
    loaded = buildFromSource(src, source);
  } catch (e) {
    if (e instanceof RuntimeError) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `${e.message} (built from source because ${why})`, { cause: e, ...(e.hint === undefined ? {} : { hint: e.hint }) });
    throw e;
  }
  origin = 'source';
  return loaded;
}

function buildFromSource(src: string, source: Buffer): CpuAddon {
  const cxx = process.env[NATIVE_CXX_ENV] ?? 'g++';
  const version = compilerVersion(cxx);
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
  return requireAddon(out);
}

function requireAddon(file: string): CpuAddon {
  let addon: CpuAddon;
  try {
    addon = require_(file) as CpuAddon;
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: loading ${file} failed (${errorMessage(e)})`, { cause: e });
  }
  const stale = addonAbiProblem(addon);
  if (stale !== undefined) throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cpu-native: ${file} cannot run these programs: ${stale}`, { hint: `rebuild it (node scripts/build-cpu-prebuilt.mjs), or unset ${NATIVE_ADDON_ENV} to build from source` });
  return addon;
}
