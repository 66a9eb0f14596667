import { execFile } from 'node:child_process';
import { accessSync, constants as fsConstants, existsSync, readdirSync, realpathSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';

/** Paths of the upstream MLIR tools this package drives. */
export interface MlirTools {
  /** `mlir-opt` (19.x). */
  readonly mlirOpt: string;
  /** `mlir-cpu-runner`, when installed. */
  readonly cpuRunner: string | undefined;
  /** `libmlir_runner_utils` and `libmlir_c_runner_utils` (for `printMemref*`), when found. */
  readonly runnerLibs: readonly string[];
}

/** Whether the tools were found; `missing` carries what is absent and how to install it. */
export type FindToolsResult = { readonly status: 'found'; readonly tools: MlirTools } | { readonly status: 'missing'; readonly reason: string; readonly hint: string };

/**
 * The pipeline that takes an emitted module to the LLVM dialect: elementwise ops on tensors to
 * linalg (only the runner harness has any), one-shot bufferization across function boundaries
 * (identity layouts, so callers pass plain buffers), linalg to loops, then the standard
 * conversions; `math-to-libm` turns `math.tanh`/`math.erf` into libm calls that the JIT resolves.
 */
export const LLVM_PIPELINE: readonly string[] = [
  '--convert-elementwise-to-linalg',
  '--one-shot-bufferize=bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map',
  '--convert-linalg-to-loops',
  '--convert-scf-to-cf',
  '--expand-strided-metadata',
  '--lower-affine',
  '--finalize-memref-to-llvm',
  '--convert-math-to-libm',
  '--convert-math-to-llvm',
  '--convert-arith-to-llvm',
  '--convert-func-to-llvm',
  '--convert-cf-to-llvm',
  '--reconcile-unrealized-casts',
];

const INSTALL_HINT = 'install the Debian/Ubuntu packages mlir-19-tools (mlir-opt-19, mlir-cpu-runner-19) and libmlir-19 (runner libraries), or set STAGEML_MLIR_OPT, STAGEML_MLIR_CPU_RUNNER and STAGEML_MLIR_LIB_DIR';

function onPath(names: readonly string[], env: NodeJS.ProcessEnv): string | undefined {
  for (const dir of (env['PATH'] ?? '').split(delimiter)) {
    if (dir === '') continue;
    for (const n of names) {
      const p = join(dir, n);
      try {
        accessSync(p, fsConstants.X_OK);
        return p;
      } catch {
        // not here; keep looking
      }
    }
  }
  return undefined;
}

function findLibs(dirs: readonly string[]): string[] {
  for (const dir of dirs) {
    if (!existsSync(dir)) continue;
    const files = readdirSync(dir);
    const pick = (stem: string): string | undefined => files.filter((f) => f.startsWith(`${stem}.so`)).sort()[0];
    const a = pick('libmlir_runner_utils');
    const b = pick('libmlir_c_runner_utils');
    if (a !== undefined && b !== undefined) return [join(dir, a), join(dir, b)];
  }
  return [];
}

/**
 * Finds `mlir-opt`, `mlir-cpu-runner` and the runner libraries: environment overrides
 * (`STAGEML_MLIR_OPT`, `STAGEML_MLIR_CPU_RUNNER`, `STAGEML_MLIR_LIB_DIR`), then `*-19` and
 * unversioned names on `PATH`, then the LLVM 19 library directory. Missing `mlir-opt` is a
 * `missing` result, never an exception.
 */
export function findMlirTools(env: NodeJS.ProcessEnv = process.env): FindToolsResult {
  const mlirOpt = env['STAGEML_MLIR_OPT'] ?? onPath(['mlir-opt-19', 'mlir-opt'], env);
  if (mlirOpt === undefined) return { status: 'missing', reason: 'mlir-opt (19.x) is not on PATH', hint: INSTALL_HINT };
  const cpuRunner = env['STAGEML_MLIR_CPU_RUNNER'] ?? onPath(['mlir-cpu-runner-19', 'mlir-cpu-runner'], env);
  const dirs = [env['STAGEML_MLIR_LIB_DIR'], '/usr/lib/llvm-19/lib', cpuRunner === undefined ? undefined : join(dirname(realpathSync(cpuRunner)), '..', 'lib')];
  return { status: 'found', tools: { mlirOpt, cpuRunner, runnerLibs: findLibs(dirs.filter((d): d is string => d !== undefined)) } };
}

/** Outcome of running a tool: its output, or its diagnostics. */
export type ToolResult = { readonly ok: true; readonly output: string } | { readonly ok: false; readonly diagnostics: string };

function run(cmd: string, args: readonly string[], timeoutMs: number): Promise<ToolResult> {
  return new Promise((resolve) => {
    execFile(cmd, [...args], { maxBuffer: 256 * 1024 * 1024, timeout: timeoutMs }, (err, stdout, stderr) => {
      if (err === null) resolve({ ok: true, output: stdout });
      else resolve({ ok: false, diagnostics: `${stderr}${stderr === '' ? err.message : ''}`.trim() });
    });
  });
}

/** Options of `verifyMlir`. */
export interface VerifyOptions {
  /** `verify`: parse and verify only; `llvm` (default): also run `LLVM_PIPELINE` with `--verify-each`. */
  readonly pipeline?: 'verify' | 'llvm';
  /** Kill the tool after this many milliseconds (default 120 000). */
  readonly timeoutMs?: number;
}

async function withTemp<T>(f: (dir: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'stageml-mlir-'));
  try {
    return await f(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/**
 * Runs `mlir-opt --verify-each` on a module, optionally through `LLVM_PIPELINE`. Returns the
 * output (the LLVM-dialect module for `llvm`) or mlir-opt's diagnostics.
 */
export function verifyMlir(text: string, tools: MlirTools, opts: VerifyOptions = {}): Promise<ToolResult> {
  return withTemp(async (dir) => {
    const input = join(dir, 'input.mlir');
    const output = join(dir, 'output.mlir');
    await writeFile(input, text);
    const passes = opts.pipeline === 'verify' ? [] : LLVM_PIPELINE;
    const r = await run(tools.mlirOpt, ['--verify-each', ...passes, input, '-o', output], opts.timeoutMs ?? 120_000);
    return r.ok ? { ok: true, output: await readFile(output, 'utf8') } : r;
  });
}

/**
 * Executes `@main` of an LLVM-dialect module (from `verifyMlir(…, { pipeline: 'llvm' })`) with
 * `mlir-cpu-runner` and the runner libraries, returning its stdout.
 */
export function executeOnCpu(llvmText: string, tools: MlirTools, timeoutMs = 120_000): Promise<ToolResult> {
  const runner = tools.cpuRunner;
  if (runner === undefined || tools.runnerLibs.length === 0) {
    return Promise.resolve({ ok: false, diagnostics: `mlir-cpu-runner or its runner libraries are missing; ${INSTALL_HINT}` });
  }
  return withTemp(async (dir) => {
    const input = join(dir, 'module.mlir');
    await writeFile(input, llvmText);
    return run(runner, ['-e', 'main', '-entry-point-result=void', `-shared-libs=${tools.runnerLibs.join(',')}`, input], timeoutMs);
  });
}
