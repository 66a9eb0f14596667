import { spawn, spawnSync } from 'node:child_process';

/** What nvcc was asked to produce. */
export type NvccTarget = 'ptx' | 'cubin';

/** Outcome of a compile: an expected result, not an exception (a missing toolchain is `missing`). */
export type NvccResult =
  | { readonly status: 'ok'; readonly command: readonly string[]; readonly stderr: string }
  | { readonly status: 'error'; readonly command: readonly string[]; readonly stderr: string; readonly exitCode: number | null }
  | { readonly status: 'missing'; readonly command: readonly string[]; readonly reason: string };

/** Options of `compileCuda`. */
export interface NvccOptions {
  /** The nvcc binary (default `nvcc`). */
  readonly nvcc?: string;
  /** Extra include directories. */
  readonly includeDirs?: readonly string[];
}

/**
 * The nvcc command line for one translation unit: sm_90a, C++17, -O3; for cubins also
 * `-Xptxas -v`, whose report `parsePtxasReport` reads.
 */
export function nvccCommand(source: string, output: string, target: NvccTarget, opts: NvccOptions = {}): string[] {
  return [
    opts.nvcc ?? 'nvcc',
    '-std=c++17',
    '-O3',
    '-arch=sm_90a',
    `-${target}`,
    ...(target === 'cubin' ? ['-Xptxas', '-v'] : []),
    ...(opts.includeDirs ?? []).map((d) => `-I${d}`),
    source,
    '-o',
    output,
  ];
}

/** Runs nvcc (synchronously). A binary that cannot be started is `missing`. */
export function compileCuda(source: string, output: string, target: NvccTarget, opts: NvccOptions = {}): NvccResult {
  const command = nvccCommand(source, output, target, opts);
  const r = spawnSync(command[0]!, command.slice(1), { encoding: 'utf8' });
  if (r.error !== undefined) return { status: 'missing', command, reason: r.error.message };
  if (r.status !== 0) return { status: 'error', command, stderr: r.stderr, exitCode: r.status };
  return { status: 'ok', command, stderr: r.stderr };
}

/** `compileCuda` without blocking: several translation units can compile in parallel. */
export function compileCudaAsync(source: string, output: string, target: NvccTarget, opts: NvccOptions = {}): Promise<NvccResult> {
  const command = nvccCommand(source, output, target, opts);
  return new Promise((resolve) => {
    const child = spawn(command[0]!, command.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      stderr += d;
    });
    child.on('error', (e) => {
      resolve({ status: 'missing', command, reason: e.message });
    });
    child.on('close', (code) => {
      resolve(code === 0 ? { status: 'ok', command, stderr } : { status: 'error', command, stderr, exitCode: code });
    });
  });
}

/** One kernel entry of a ptxas `-v` report. */
export interface PtxasEntry {
  /** The entry's (mangled) name. */
  readonly entry: string;
  readonly registers: number;
  readonly spillStores: number;
  readonly spillLoads: number;
  readonly stackFrame: number;
  /** Static shared memory (dynamic shared memory is not in the report). */
  readonly sharedBytes: number;
}

/** Parses the per-entry register, spill, stack and shared-memory lines of `ptxas -v` output. */
export function parsePtxasReport(text: string): PtxasEntry[] {
  const out: PtxasEntry[] = [];
  let entry: string | undefined;
  let frame: [number, number, number] = [0, 0, 0];
  for (const line of text.split('\n')) {
    const name = /Compiling entry function '([^']+)'/.exec(line);
    if (name !== null) {
      entry = name[1];
      frame = [0, 0, 0];
      continue;
    }
    const f = /(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads/.exec(line);
    if (f !== null) frame = [Number(f[1]), Number(f[2]), Number(f[3])];
    const u = /Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?/.exec(line);
    if (u !== null && entry !== undefined) {
      out.push({ entry, registers: Number(u[1]), stackFrame: frame[0], spillStores: frame[1], spillLoads: frame[2], sharedBytes: Number(u[2] ?? 0) });
      entry = undefined;
    }
  }
  return out;
}
