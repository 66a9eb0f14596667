import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import type { Socket } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type DType, type Graph, type HostTensor, type OpKey, type TensorType, dtypeBytes, graphToJson, isFloatDType, typeToString } from '@stageml/ir';
import { CacheLostError, RuntimeCode, type RuntimeErrorCode, RuntimeError } from '../errors.js';
import { type CacheRun, type Executor, type ExecutorCapabilities, GPU_SCHEDULING, type PreparedGraph, expandFor, type RowSample, type RunOptions, checkInputs, checkRowSamples, inputGeneration, resolveWeights } from '../executor.js';
import type { ValueSource } from '../values.js';
import { FrameDecoder, TORCH_PROTOCOL_VERSION, encodeFrame } from './protocol.js';

/** Environment variable naming the Python interpreter of the torch worker. */
export const TORCH_PYTHON_ENV = 'STAGEML_PYTHON';
/** Environment variable naming the directory that holds the `stageml_torch` package. */
export const TORCH_PATH_ENV = 'STAGEML_TORCH_PATH';
/** Environment variable choosing the worker's device (`auto`, `cpu`, `cuda`, `cuda:1`, …). */
export const TORCH_DEVICE_ENV = 'STAGEML_TORCH_DEVICE';
/** Environment variable giving the worker's tensor-parallel size (ranks, one per device; default 1). */
export const TORCH_TENSOR_PARALLEL_ENV = 'STAGEML_TORCH_TENSOR_PARALLEL_SIZE';

/**
 * The composite ops the worker runs with handlers of its own (its op table, native/stageml_torch/ops.py
 * `OPS`): the serving ops `loraBankLinear` (the bank kernel on CUDA), `loraBank`, `loraLinear` (its decomposition, op by
 * op) and `cachedAttention` (the step's keys appended to a staged cache in place, SDPA) among them. Every other composite, and any op added
 * with `registerOp`, reaches the worker as its decomposition (`expandFor`).
 */
export const TORCH_WORKER_COMPOSITES: ReadonlySet<OpKey> = new Set<OpKey>(['rmsNorm', 'rotary', 'attention', 'loraBank', 'loraBankLinear', 'loraLinear', 'cachedAttention']);

/**
 * The composites a tensor-parallel worker group runs as ops: the sharding pass (native/stageml_torch/tp.py)
 * places products, gathers and attention, so `loraBank` and `cachedAttention` reach it as their
 * decompositions, whose weights, slot tables and caches it splits over the ranks.
 */
const TORCH_TP_COMPOSITES: ReadonlySet<OpKey> = new Set<OpKey>(['rmsNorm', 'rotary', 'attention']);

/**
 * What a torch worker runs (`torch-cpu`, `torch-cuda`): every op (conformance-tested) in every
 * float dtype, fusing `TORCH_WORKER_COMPOSITES` (with more than one rank, those the sharding pass places); on CUDA its runs make token picks (`devicePicks`).
 */
export function torchCapabilities(cuda: boolean, tensorParallelSize = 1): ExecutorCapabilities {
  return {
    name: cuda ? 'torch-cuda' : 'torch-cpu',
    fuses: tensorParallelSize > 1 ? TORCH_TP_COMPOSITES : TORCH_WORKER_COMPOSITES,
    supportsOp: () => true,
    lateBinding: true,
    dtypes: ['f64', 'f32', 'bf16', 'f16'],
    ...(cuda ? { devicePicks: true, scheduling: GPU_SCHEDULING } : {}),
  };
}

const APT_HINT = 'install Python 3 and PyTorch (Debian/Ubuntu: apt-get install python3 python3-torch; a CUDA host: pip install torch), or point STAGEML_PYTHON at an interpreter that has torch';

/** Options of `createTorchExecutor`. */
export interface TorchExecutorOptions {
  /** Python interpreter (default: `STAGEML_PYTHON`, else the first of `python3`, `/usr/bin/python3` that imports torch). */
  readonly python?: string;
  /** Directory holding the `stageml_torch` package (default: `STAGEML_TORCH_PATH`, else the repository's `native/`). */
  readonly packageDir?: string;
  /** Device of the worker: `auto` (CUDA when torch sees it, else CPU), `cpu`, `cuda`, `cuda:N` (default: `STAGEML_TORCH_DEVICE`, else `auto`). */
  readonly device?: string;
  /** Receives the worker's stderr lines, and one line per prepared graph naming the kernel steps the worker gave it (default: dropped). */
  readonly log?: (line: string) => void;
  /** Environment variables added to the worker's (e.g. `STAGEML_TORCH_FUSE`, `STAGEML_TORCH_GRAPHS`; docs/gpu.md). */
  readonly env?: Readonly<Record<string, string>>;
  /**
   * Tensor-parallel size: the worker runs as this many ranks (processes), rank r on `cuda:r` (NCCL)
   * or on the CPU (gloo), each holding its part of every weight, slot table and KV cache
   * (native/stageml_torch/tp.py; docs/gpu.md). Default: `STAGEML_TORCH_TENSOR_PARALLEL_SIZE`, else 1.
   * Not an integer >= 1, more CUDA ranks than devices, or a model whose heads it does not divide is
   * `RT_TENSOR_PARALLEL`.
   */
  readonly tensorParallelSize?: number;
}

/** Which kernel steps the worker gave a graph's ops when it prepared it (all 0: every op runs its table entry). */
export interface TorchFusion {
  /** `loraBankLinear` ops run as one bank-kernel step (native/stageml_torch/bank.py; `STAGEML_TORCH_FUSE`). */
  readonly slotLinears: number;
  /** Sets of those sharing one input (a layer's q, k, v; gate, up) run as one step (`STAGEML_TORCH_BANK_SETS`). */
  readonly slotSets: number;
  /** Joins of a cache with the step's keys or values that append in place on the worker: two per `cachedAttention` op. */
  readonly cacheConcats: number;
  /** Collectives (all-reduces, all-gathers) one run of a tensor-parallel rank's graph makes (0 with one rank). */
  readonly collectives: number;
}

/** A graph prepared by the torch executor: a `PreparedGraph` that also says what the worker fused. */
export interface TorchPreparedGraph extends PreparedGraph {
  /** The fusions of the worker that prepared it last (a restarted worker prepares it again). */
  readonly fused: TorchFusion;
}

/** A tensor of a safetensors file, for the worker to read itself (`TorchDeviceTensors.load`). */
export interface FileTensorRef {
  /** Path of the .safetensors file. */
  readonly file: string;
  /** The tensor's name in that file. */
  readonly tensor: string;
  /** The dtype to hold it in on the device (a float dtype): converted there from the stored one as the host would (exact widening to f32, then round to nearest even). */
  readonly dtype: DType;
  /** Its shape, as the file stores it. */
  readonly shape: readonly number[];
}

/** One write into a device tensor: `data` over its flattened elements [start, start + data.length). */
export interface DeviceWrite {
  /** A handle from `TorchDeviceTensors.zeros` (or `load`). */
  readonly target: HostTensor;
  /** First element (of the flattened tensor) written. */
  readonly start: number;
  /** The values, in the IR's host storage of the target's dtype (f32 for bf16/f16: already rounded to it), unless `exact` is false. */
  readonly data: Float32Array;
  /**
   * false: `data` holds f32 values the worker rounds to the target's float dtype (to nearest even,
   * as `roundFloat32InPlace`) as it writes them — the host does no pass over them (default true:
   * already rounded). Implied by `scale` and `transpose`.
   */
  readonly exact?: boolean;
  /** Each f32 value times this (in f64, the product rounded to f32) before it is rounded to the target's dtype. */
  readonly scale?: number;
  /** `data` is a [rows, columns] matrix written transposed ([columns, rows] row-major), after `scale`. */
  readonly transpose?: readonly [number, number];
}

/**
 * Tensors that live on the worker's device only: the host holds a handle (dtype, shape and a data
 * placeholder with only a `length`, never sent) and how to make the tensor again — the file and
 * tensor name it was read from, or for a table written by ranges a restorer giving its contents —
 * which a new worker (after the last one died) gets before it runs anything. Handles are fed to
 * runs like any input (as resident inputs: by id); a handle the host drops is freed on the worker.
 */
export interface TorchDeviceTensors {
  /** Reads tensors from safetensors files on the worker (memory-mapped, in the stored dtype, converted on the device): one handle per ref. A missing or malformed file, a missing tensor or a shape other than the file's is `RT_BAD_VALUE` and nothing is kept. */
  load(refs: readonly FileTensorRef[]): Promise<HostTensor[]>;
  /** Zero tensors on the worker's device (slot tables), one handle per entry. */
  zeros(entries: readonly { readonly dtype: DType; readonly shape: readonly number[] }[]): Promise<HostTensor[]>;
  /** Writes element ranges of device tensors in place (one request; in order with the runs after it). Bad ranges are `RT_BAD_VALUE`. */
  write(writes: readonly DeviceWrite[]): Promise<void>;
  /**
   * Registers what rewrites the zeros tensors' contents on a new worker: called (after their
   * zeros are re-made) whenever a worker replaced one that died, before the first request that
   * needs them; its writes are sent like `write`'s. A restorer that gives its writes in parts (an
   * async iterable, e.g. one slot's factors a part) has each part sent and landed before it builds
   * the next, so the host holds one part at a time, not the whole table's contents.
   */
  onRestore(restore: () => Promise<readonly DeviceWrite[]> | AsyncIterable<readonly DeviceWrite[]>): void;
  /** Whether `t` is a handle of a device tensor (of this executor). */
  holds(t: HostTensor): boolean;
  /** Bytes the device tensors take on the worker's device (live handles). */
  bytes(): number;
}

/** What the worker said about itself at start. */
export interface TorchWorkerInfo {
  /** The Python interpreter running the worker. */
  readonly python: string;
  readonly protocol: number;
  readonly worker: string;
  readonly torch: string;
  readonly device: string;
  readonly deviceName: string;
  readonly cuda: boolean;
  /** The device's memory at start (bytes): the GPU's total and free, or the host's on a CPU worker; undefined when the worker could not read it. */
  readonly memory: { readonly total: number; readonly free: number } | undefined;
  /** Ranks of the worker group (`TorchExecutorOptions.tensorParallelSize`; 1: one process). */
  readonly tensorParallelSize: number;
  /** The device of each rank (rank 0's is `device`). */
  readonly rankDevices: readonly string[];
}

/** Bytes and requests the torch executor has exchanged with its workers (`TorchExecutor.traffic`). */
export interface TorchTraffic {
  /** Requests sent. */
  readonly requests: number;
  /** Bytes written to the worker: frame lengths, headers and tensors. */
  readonly sentBytes: number;
  /** The tensor payload part of `sentBytes`. */
  readonly sentTensorBytes: number;
  /** Bytes read from the worker. */
  readonly receivedBytes: number;
  /** Workers started after the first one died. */
  readonly restarts: number;
}

/** The torch executor: an `Executor` plus the worker's identity and a way to stop it. */
export interface TorchExecutor extends Executor {
  /** The worker's versions and device. */
  readonly info: TorchWorkerInfo;
  /** Caches (per-sequence KV) held on the worker's device between runs (`RunOptions.caches`). */
  readonly caches: NonNullable<Executor['caches']>;
  /** Tensors held on the worker's device only (weights the worker reads from files, slot tables written by ranges). */
  readonly device: TorchDeviceTensors;
  /** The worker process id (undefined while none runs): rank 0's with tensor parallelism. */
  readonly pid: number | undefined;
  /** The process ids of the live worker group, rank by rank (`[pid]` with one rank; empty while none runs). */
  readonly rankPids: readonly number[];
  /** Counters of the traffic with the worker, since the executor started. */
  traffic(): TorchTraffic;
  /** Stops the worker process; prepared graphs fail with `RT_DISPOSED` afterwards. */
  close(): Promise<void>;
  /** Prepares `graph` on the worker (see `Executor.prepare`); the result also says what was fused. */
  prepare(graph: Graph, weights?: ValueSource): Promise<TorchPreparedGraph>;
}

function findPackageDir(explicit: string | undefined): string {
  const candidates: string[] = [];
  const env = explicit ?? process.env[TORCH_PATH_ENV];
  if (env !== undefined && env !== '') candidates.push(env);
  else {
    const starts: string[] = [process.cwd()];
    try {
      // NOTE: empty in the CJS build; the cwd search below still finds the repository.
      const url = (import.meta as { url?: string }).url;
      if (url !== undefined) starts.unshift(dirname(fileURLToPath(url)));
    } catch {
      // not a file URL: fall through to the cwd
    }
    for (const s of starts) {
      let d = resolve(s);
      for (let i = 0; i < 8; i++) {
        candidates.push(join(d, 'native'));
        const up = dirname(d);
        if (up === d) break;
        d = up;
      }
    }
  }
  const hit = candidates.find((c) => existsSync(join(c, 'stageml_torch', '__init__.py')));
  if (hit === undefined) {
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `the torch executor cannot find the stageml_torch package (looked in ${candidates.slice(0, 3).join(', ')}${candidates.length > 3 ? ', …' : ''})`, {
      hint: `set ${TORCH_PATH_ENV} to the directory holding stageml_torch/ (the repository's native/)`,
    });
  }
  return hit;
}

/** The interpreters to try, in order: `explicit`, else `STAGEML_PYTHON`, else `python3` then `/usr/bin/python3`. */
function pythonCandidates(explicit: string | undefined): string[] {
  const env = explicit ?? process.env[TORCH_PYTHON_ENV];
  return env !== undefined && env !== '' ? [env] : ['python3', '/usr/bin/python3'];
}

function findPython(explicit: string | undefined): string {
  const reasons: string[] = [];
  for (const py of pythonCandidates(explicit)) {
    const r = spawnSync(py, ['-c', 'import torch'], { encoding: 'utf8', timeout: 60_000 });
    if (r.error !== undefined) {
      reasons.push(`${py}: ${(r.error as NodeJS.ErrnoException).code === 'ENOENT' ? 'not found' : r.error.message}`);
      continue;
    }
    if (r.status === 0) return py;
    const last = r.stderr.trim().split('\n').pop() ?? `exit ${String(r.status)}`;
    reasons.push(`${py}: ${last}`);
  }
  throw noPython(reasons);
}

function noPython(reasons: readonly string[]): RuntimeError {
  return new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `the torch executor needs Python 3 with torch (${reasons.join('; ')})`, { hint: APT_HINT });
}

interface Pending {
  resolve: (f: { header: Record<string, unknown>; tensors: Record<string, HostTensor> }) => void;
  reject: (e: Error) => void;
}

const KNOWN_CODES: ReadonlySet<string> = new Set(Object.values(RuntimeCode));

/** The worker process and its request queue (one request in flight, replies in order). */
class WorkerConnection {
  readonly #child: ChildProcessWithoutNullStreams;
  readonly #decoder = new FrameDecoder();
  readonly #pending: Pending[] = [];
  #nextId = 1;
  #dead: RuntimeError | undefined;
  #stderr: string[] = [];
  #spawnError: NodeJS.ErrnoException | undefined;
  #replies = 0;
  #early: string[] = [];
  readonly #log: ((line: string) => void) | undefined;
  readonly #stderrEnded: Promise<unknown>;

  /** The group's process ids from `hello` (rank 0's alone with one rank). */
  rankPids: readonly number[] = [];

  constructor(python: string, packageDir: string, device: string, log: ((line: string) => void) | undefined, readonly counts: { requests: number; sentBytes: number; sentTensorBytes: number; receivedBytes: number }, extraEnv: Readonly<Record<string, string>> = {}, tensorParallelSize = 1) {
    // NCCL_NVLS_ENABLE=0: no NVLink multicast for a tensor-parallel group (the ranks set it too).
    const env = { ...process.env, ...extraEnv, PYTHONPATH: [packageDir, process.env['PYTHONPATH']].filter((p) => p !== undefined && p !== '').join(':'), PYTHONUNBUFFERED: '1', ...(tensorParallelSize > 1 ? { NCCL_NVLS_ENABLE: '0' } : {}) };
    const args = ['-m', 'stageml_torch.worker', '--device', device, ...(tensorParallelSize > 1 ? ['--tensor-parallel-size', String(tensorParallelSize)] : [])];
    this.#child = spawn(python, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    this.#child.stdout.on('data', (chunk: Buffer) => {
      this.counts.receivedBytes += chunk.byteLength;
      this.#decoder.push(chunk);
      this.#drain();
    });
    this.#child.stderr.setEncoding('utf8');
    this.#log = log;
    this.#stderrEnded = new Promise((r) => this.#child.stderr.once('close', r));
    this.#child.stderr.on('data', (s: string) => {
      for (const line of s.split('\n')) {
        if (line === '') continue;
        this.#stderr.push(line);
        if (this.#stderr.length > 20) this.#stderr.shift();
        // Until the worker first answers, its lines wait: an interpreter that cannot start it
        // (no torch) is only a candidate passed over (firstWorker), not a traceback in the log.
        if (this.#replies > 0) log?.(line);
        else if (this.#early.length < 200) this.#early.push(line);
      }
    });
    this.#child.on('error', (e) => {
      this.#spawnError ??= e;
      this.#fail(new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `cannot start the torch worker (${python}): ${e.message}`, { cause: e, hint: APT_HINT }));
    });
    this.#child.on('exit', (code, signal) => {
      const tail = this.#stderr.slice(-3).join(' | ');
      this.#fail(new RuntimeError(RuntimeCode.WORKER_FAILED, `the torch worker exited (${signal ?? `code ${String(code)}`})${tail === '' ? '' : `: ${tail}`}`));
    });
    this.#child.stdin.on('error', () => {
      // EPIPE after the worker died: the exit handler reports it.
    });
    this.#idle();
  }

  #drain(): void {
    for (;;) {
      let frame;
      try {
        frame = this.#decoder.next();
      } catch (e) {
        this.#fail(e as RuntimeError);
        this.#child.kill();
        return;
      }
      if (frame === undefined) return;
      if (this.#replies++ === 0) {
        for (const line of this.#early.splice(0)) this.#log?.(line);
      }
      const p = this.#pending.shift();
      if (p === undefined) {
        this.#fail(new RuntimeError(RuntimeCode.WORKER_FAILED, 'torch worker protocol: a reply arrived with no request waiting'));
        return;
      }
      if (this.#pending.length === 0) this.#idle();
      if (frame.header['ok'] === true) p.resolve(frame);
      else {
        const code = frame.header['code'];
        const message = frame.header['message'];
        const known = typeof code === 'string' && KNOWN_CODES.has(code) ? (code as RuntimeErrorCode) : RuntimeCode.WORKER_FAILED;
        p.reject(new RuntimeError(known, `torch worker: ${typeof message === 'string' ? message : 'request failed'}`));
      }
    }
  }

  #fail(e: RuntimeError): void {
    this.#dead ??= e;
    for (const p of this.#pending.splice(0)) p.reject(e);
  }

  // The worker must not keep Node alive while no request waits on it.
  // (The pipes are net.Socket instances, which the stream types do not show.)
  #idle(): void {
    this.#child.unref();
    for (const s of [this.#child.stdout, this.#child.stderr, this.#child.stdin] as unknown as Socket[]) s.unref();
  }

  #busy(): void {
    this.#child.ref();
    for (const s of [this.#child.stdout, this.#child.stderr, this.#child.stdin] as unknown as Socket[]) s.ref();
  }

  get alive(): boolean {
    return this.#dead === undefined;
  }

  /** Whether the worker ever answered (a process that never did did not start: no interpreter, no torch). */
  get answered(): boolean {
    return this.#replies > 0;
  }

  /** Why a worker that never answered did not start (after its stderr closed, or 1 s): the interpreter not found, else its last line on stderr. */
  async startFailure(): Promise<string> {
    await Promise.race([this.#stderrEnded, new Promise((r) => setTimeout(r, 1000).unref())]);
    const e = this.#spawnError;
    if (e !== undefined) return e.code === 'ENOENT' ? 'not found' : e.message;
    return this.#stderr.at(-1) ?? this.#dead?.message ?? 'no reply';
  }

  get pid(): number | undefined {
    return this.#child.pid;
  }

  request(header: Record<string, unknown>, tensors: Readonly<Record<string, HostTensor>> = {}): Promise<{ header: Record<string, unknown>; tensors: Record<string, HostTensor> }> {
    if (this.#dead !== undefined) return Promise.reject(this.#dead);
    const chunks = encodeFrame({ ...header, id: this.#nextId++ }, tensors);
    const total = chunks.reduce((a, c) => a + c.byteLength, 0);
    this.counts.requests++;
    this.counts.sentBytes += total;
    this.counts.sentTensorBytes += total - 4 - chunks[1]!.byteLength;
    return new Promise((resolve, reject) => {
      this.#pending.push({ resolve, reject });
      this.#busy();
      // One write for the frame: corked, the length, header and tensors leave in one writev (a
      // write each was a system call each, ~8 per decode step).
      const stdin = this.#child.stdin;
      stdin.cork();
      for (const c of chunks) stdin.write(c);
      stdin.uncork();
    });
  }

  async close(): Promise<void> {
    if (this.#dead !== undefined) return;
    const exited = new Promise<void>((r) => {
      this.#child.once('exit', () => {
        r();
      });
    });
    try {
      await this.request({ op: 'shutdown' });
    } catch {
      // already failing: kill below
    }
    this.#child.stdin.end();
    const timer = setTimeout(() => this.#child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }
}

/**
 * The worker of the first candidate interpreter that answers `hello`. The worker imports torch
 * itself, so no separate `python -c "import torch"` runs first (that was a second torch import, 2–4 s
 * of every start on a GPU host). A candidate whose worker never answered (no such interpreter, no
 * torch in it) gives way to the next; one that answered and refused (a device it does not see,
 * another protocol) fails the start as it is.
 */
async function firstWorker(candidates: readonly string[], start: (python: string) => WorkerConnection): Promise<{ conn: WorkerConnection; python: string; info: TorchWorkerInfo }> {
  const reasons: string[] = [];
  for (const python of candidates) {
    const conn = start(python);
    try {
      return { conn, python, info: await greet(conn, python) };
    } catch (e) {
      if (conn.answered) throw e;
      reasons.push(`${python}: ${await conn.startFailure()}`);
    }
  }
  throw noPython(reasons);
}

/** What `hello` answered, checked against this build; a worker that did not start is `RT_BACKEND_UNAVAILABLE`. */
async function greet(conn: WorkerConnection, python: string): Promise<TorchWorkerInfo> {
  let hello;
  try {
    hello = (await conn.request({ op: 'hello' })).header;
  } catch (e) {
    await conn.close();
    if (e instanceof RuntimeError && e.code === RuntimeCode.WORKER_FAILED) {
      throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `the torch worker did not start: ${e.message}`, { cause: e, hint: APT_HINT });
    }
    throw e;
  }
  const group = hello['tensorParallel'] as { size?: unknown; pids?: unknown; devices?: unknown } | undefined;
  const pids = Array.isArray(group?.pids) ? (group.pids as number[]) : conn.pid === undefined ? [] : [conn.pid];
  conn.rankPids = pids;
  if (hello['protocol'] !== TORCH_PROTOCOL_VERSION) {
    await conn.close();
    throw new RuntimeError(RuntimeCode.BACKEND_UNAVAILABLE, `the torch worker speaks protocol ${String(hello['protocol'])}, this build speaks ${String(TORCH_PROTOCOL_VERSION)}`, {
      hint: `${TORCH_PATH_ENV} may point at another version of stageml_torch`,
    });
  }
  return {
    python,
    protocol: TORCH_PROTOCOL_VERSION,
    worker: String(hello['worker']),
    torch: String(hello['torch']),
    device: String(hello['device']),
    deviceName: String(hello['deviceName']),
    cuda: hello['cuda'] === true,
    memory: deviceMemory(hello['memory']),
    tensorParallelSize: typeof group?.size === 'number' ? group.size : 1,
    rankDevices: Array.isArray(group?.devices) ? (group.devices as string[]).map(String) : [String(hello['device'])],
  };
}

/** The tensor-parallel size of `createTorchExecutor`'s options (or its environment variable), checked. */
export function tensorParallelSizeOf(given: number | undefined): number {
  const env = process.env[TORCH_TENSOR_PARALLEL_ENV];
  const raw: unknown = given ?? (env === undefined || env === '' ? 1 : Number(env));
  if (typeof raw !== 'number' || !Number.isSafeInteger(raw) || raw < 1) {
    const what = given === undefined ? `${TORCH_TENSOR_PARALLEL_ENV}=${String(env)}` : String(given);
    throw new RuntimeError(RuntimeCode.TENSOR_PARALLEL, `the tensor-parallel size must be an integer >= 1, got ${what}`);
  }
  return raw;
}

function deviceMemory(m: unknown): TorchWorkerInfo['memory'] {
  if (typeof m !== 'object' || m === null) return undefined;
  const { total, free } = m as Record<string, unknown>;
  return typeof total === 'number' && typeof free === 'number' ? { total, free } : undefined;
}

/** Placeholder of a cache-fed input for the input checks: its dtype and shape, with a length only (never sent). */
function placeholder(dtype: HostTensor['dtype'], shape: readonly number[]): HostTensor {
  return { dtype, shape, data: { length: shape.reduce((a, b) => a * b, 1) } as unknown as Float32Array };
}

/**
 * Creates the torch executor (`torch`): a Python worker (`python3 -m stageml_torch.worker`,
 * package in the repository's `native/`) that runs IR graphs with PyTorch on CUDA when torch sees
 * a GPU, else on the CPU. The graph travels as the IR's JSON form and parameters as raw tensors
 * over a framed stdio protocol (`encodeFrame`; docs/gpu.md); parameters stay resident on the
 * worker's device between runs, each run moves only inputs and outputs. Caches (`caches`,
 * `RunOptions.caches`: the engine's per-sequence KV) live on the worker's device too, so a decode
 * step sends O(new tokens) bytes.
 *
 * A worker that dies (killed, out of memory) fails the requests in flight with `RT_WORKER_FAILED`;
 * the next request starts a new worker, prepares every live graph on it again and re-sends
 * resident inputs and caches (from `CacheRow.restore`) as they are needed; a run over a lost
 * cache whose row has no `restore` fails with `CacheLostError` (`RT_CACHE_LOST`) instead.
 * `RunOptions.omit` outputs stay on the worker (a step's new keys and values, which its caches
 * append anyway).
 *
 * Numerics: f32/f64 compute natively; on CUDA, f16/bf16 matmuls and attention run on tensor cores
 * with f32 accumulation, norms and softmax in f32; on the CPU every f16/bf16 op computes in f32
 * and rounds to its type.
 *
 * Errors: no Python, or no torch in it, is `RT_BACKEND_UNAVAILABLE` with an install hint; a device
 * torch does not see too; an op without a torch lowering `RT_UNSUPPORTED_OP`; input checks as
 * every executor (`RT_MISSING_INPUT`, `RT_UNKNOWN_INPUT`, `RT_BAD_VALUE`); a failing op
 * `RT_EVAL_FAILED` naming the node; a dead worker or a broken frame `RT_WORKER_FAILED`;
 * `RT_DISPOSED` after `dispose()` or `close()`.
 */
export async function createTorchExecutor(opts: TorchExecutorOptions = {}): Promise<TorchExecutor> {
  const packageDir = findPackageDir(opts.packageDir);
  const device = opts.device ?? process.env[TORCH_DEVICE_ENV] ?? 'auto';
  const ranks = tensorParallelSizeOf(opts.tensorParallelSize);
  const counts = { requests: 0, sentBytes: 0, sentTensorBytes: 0, receivedBytes: 0 };
  const first = await firstWorker(pythonCandidates(opts.python), (py) => new WorkerConnection(py, packageDir, device, opts.log, counts, opts.env, ranks));
  let conn = first.conn;
  const { python, info } = first;
  const capabilities = torchCapabilities(info.device.startsWith('cuda'), ranks);
  const name = capabilities.name;
  /** Workers started so far (1 + restarts): what every worker-side handle and id belongs to. */
  let generation = 1;
  let closed = false;
  let starting: Promise<void> | undefined;
  /** The live worker, starting a new one when the last one died (once at a time). */
  const live = async (): Promise<WorkerConnection> => {
    if (closed) throw new RuntimeError(RuntimeCode.DISPOSED, `${name} was closed`);
    if (conn.alive) return conn;
    starting ??= (async () => {
      // A tensor-parallel group is started whole (rank 0 starts the others).
      const next = new WorkerConnection(python, packageDir, device, opts.log, counts, opts.env, ranks);
      await greet(next, python);
      conn = next;
      generation++;
      held = new WeakMap();
      drops.length = 0;
      known.clear();
    })().finally(() => {
      starting = undefined;
    });
    await starting;
    return conn;
  };
  // Resident inputs: sent once, held by the worker (on its device) under an id, referred to by id
  // while the same data object comes back unchanged; dropped when the data object is collected.
  let held = new WeakMap<object, { readonly id: number; readonly generation: number; readonly key: string }>();
  const drops: number[] = [];
  const collected = new FinalizationRegistry<{ id: number; generation: number }>((h) => {
    if (h.generation === generation) drops.push(h.id);
  });
  let nextId = 1;
  /** Caches the current worker holds: id → positions. */
  const known = new Map<number, number>();
  /** Ids opened and not released (a run finishing after a release does not record its cache). */
  const open = new Set<number>();
  let nextCache = 1;
  /** Open ids some request has named (a run or a fork): only those can exist on a worker, so only those are dropped there. */
  const named = new Set<number>();
  /**
   * `cache_fork` / `cache_keep` requests in flight: a run waits for them before it reads `known`,
   * so what it seeds (or finds lost) is decided against what the worker holds after them.
   */
  const cacheOps = new Set<Promise<void>>();
  /** Sends a cache request now (in order before any later run); `done` runs if it succeeds on the worker still current. */
  const cacheRequest = (header: Record<string, unknown>, done: () => void, failed: () => void): void => {
    const c = conn;
    const p: Promise<void> = c
      .request(header)
      .then(
        (reply) => {
          if (c !== conn) return;
          heldBy(reply.header);
          done();
        },
        () => {
          if (c === conn) failed();
        },
      )
      .finally(() => {
        cacheOps.delete(p);
      });
    cacheOps.add(p);
  };
  /** Records the count of caches the worker holds, which its cache requests' replies carry (`stats().caches`). */
  const heldBy = (header: Record<string, unknown>): void => {
    if (typeof header['caches'] === 'number') workerStats['caches'] = header['caches'];
  };
  /** `RT_BAD_VALUE` unless `id` is an open cache and `length` a count of positions. */
  const checkCache = (what: string, id: number, length: number): void => {
    if (!open.has(id)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `${what}: cache ${String(id)} was never opened on ${name} or was released`);
    if (!Number.isSafeInteger(length) || length < 0) throw new RuntimeError(RuntimeCode.BAD_VALUE, `${what}: length ${String(length)} is not a count of positions`);
  };
  // Device tensors: handle data object → how to make it again; every live one (for a new worker).
  const deviceData = new WeakMap<object, { readonly dtype: DType; readonly shape: readonly number[]; readonly ref: FileTensorRef | undefined; readonly bytes: number }>();
  const deviceLive = new Set<WeakRef<object>>();
  const restorers: (() => Promise<readonly DeviceWrite[]> | AsyncIterable<readonly DeviceWrite[]>)[] = [];
  /** The worker generation whose device tensors are in place. */
  let deviceGeneration = generation;
  let restoring: Promise<void> | undefined;
  const keyOf = (t: { readonly dtype: DType; readonly shape: readonly number[] }): string => `${t.dtype}[${t.shape.join(',')}]`;
  // NOTE: an engine feeds the same handles (and so the same shape arrays) every step, ~150 device
  // weights of a 16-layer model: their keys are built once per shape array, not per run.
  const shapeKeys = new WeakMap<readonly number[], { readonly dtype: DType; readonly key: string }>();
  const runKeyOf = (t: HostTensor): string => {
    const hit = shapeKeys.get(t.shape);
    if (hit?.dtype === t.dtype) return hit.key;
    const key = keyOf(t);
    shapeKeys.set(t.shape, { dtype: t.dtype, key });
    return key;
  };
  /** A handle for a new device tensor under a fresh id on the current worker. */
  const newHandle = (dtype: DType, shape: readonly number[], ref: FileTensorRef | undefined): { handle: HostTensor; id: number } => {
    const length = shape.reduce((a, b) => a * b, 1);
    const data = { length } as unknown as Float32Array;
    deviceData.set(data, { dtype, shape: [...shape], ref, bytes: length * dtypeBytes(dtype) });
    deviceLive.add(new WeakRef(data));
    const id = nextId++;
    held.set(data, { id, generation: 0, key: keyOf({ dtype, shape }) });
    collected.register(data, { id, generation });
    return { handle: { dtype, shape: [...shape], data }, id };
  };
  const writeFrame = (writes: readonly DeviceWrite[]): { header: Record<string, unknown>; tensors: Record<string, HostTensor> } => {
    const tensors: Record<string, HostTensor> = {};
    const entries = writes.map((w, i) => {
      const info = deviceData.get(w.target.data);
      if (info === undefined) throw new RuntimeError(RuntimeCode.BAD_VALUE, `write ${String(i)}: the target is not a device tensor of ${name}`);
      const id = held.get(w.target.data)?.id;
      if (id === undefined) throw new RuntimeError(RuntimeCode.WORKER_FAILED, `write ${String(i)}: the worker does not hold the target (it was restarted and not restored)`);
      const n = w.target.shape.reduce((a, b) => a * b, 1);
      if (!Number.isSafeInteger(w.start) || w.start < 0 || w.start + w.data.length > n) throw new RuntimeError(RuntimeCode.BAD_VALUE, `write ${String(i)}: elements [${String(w.start)}, ${String(w.start + w.data.length)}) lie outside ${keyOf(info)} (${String(n)} elements)`);
      const raw = w.exact === false || w.scale !== undefined || w.transpose !== undefined;
      if (raw && !isFloatDType(info.dtype)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `write ${String(i)}: unrounded, scaled or transposed values need a float target, not ${keyOf(info)}`);
      if (w.scale !== undefined && !Number.isFinite(w.scale)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `write ${String(i)}: scale ${String(w.scale)} is not a finite number`);
      const tr = w.transpose;
      if (tr !== undefined && !(tr.every((d) => Number.isSafeInteger(d) && d >= 0) && tr[0] * tr[1] === w.data.length)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `write ${String(i)}: transpose [${tr.join(', ')}] is not [rows, columns] of its ${String(w.data.length)} values`);
      // Unrounded values travel as f32 and are rounded (scaled, transposed) on the worker's device.
      tensors[`w${String(i)}`] = { dtype: raw ? 'f32' : info.dtype, shape: [w.data.length], data: w.data };
      return { id, start: w.start, tensor: `w${String(i)}`, ...(w.scale === undefined ? {} : { scale: w.scale }), ...(tr === undefined ? {} : { transpose: [...tr] }) };
    });
    return { header: { op: 'write', writes: entries }, tensors };
  };
  /** Re-makes every live device tensor on a worker that replaced a dead one, then runs the restorers. */
  const ensureDevice = async (c: WorkerConnection): Promise<void> => {
    if (deviceGeneration === generation) return;
    restoring ??= (async () => {
      const gen = generation;
      const files: Record<string, unknown>[] = [];
      const allocs: Record<string, unknown>[] = [];
      for (const w of deviceLive) {
        const data = w.deref();
        if (data === undefined) {
          deviceLive.delete(w);
          continue;
        }
        const info = deviceData.get(data)!;
        const id = nextId++;
        held.set(data, { id, generation: 0, key: keyOf(info) });
        collected.register(data, { id, generation: gen });
        if (info.ref === undefined) allocs.push({ id, dtype: info.dtype, shape: info.shape });
        else files.push({ id, file: info.ref.file, tensor: info.ref.tensor, dtype: info.dtype, shape: info.shape });
      }
      if (allocs.length > 0) await c.request({ op: 'alloc', allocs });
      if (files.length > 0) await c.request({ op: 'load', files });
      for (const r of restorers) {
        const got = r();
        const parts: AsyncIterable<readonly DeviceWrite[]> | (readonly DeviceWrite[])[] = Symbol.asyncIterator in got ? got : [await got];
        for await (const writes of parts) {
          if (writes.length === 0) continue;
          const f = writeFrame(writes);
          await c.request(f.header, f.tensors);
        }
      }
      if (gen === generation) deviceGeneration = gen;
    })().finally(() => {
      restoring = undefined;
    });
    await restoring;
  };
  const deviceTensors: TorchDeviceTensors = {
    async load(refs) {
      refs.forEach((r, i) => {
        if (!isFloatDType(r.dtype)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `load ${String(i)} ('${r.tensor}'): dtype ${r.dtype} is not a float dtype`);
        if (!r.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `load ${String(i)} ('${r.tensor}'): shape [${r.shape.join(', ')}] is not a list of sizes`);
      });
      const c = await live();
      await ensureDevice(c);
      const made = refs.map((r) => newHandle(r.dtype, r.shape, { ...r, shape: [...r.shape] }));
      try {
        await c.request({ op: 'load', files: refs.map((r, i) => ({ id: made[i]!.id, file: r.file, tensor: r.tensor, dtype: r.dtype, shape: r.shape })) });
      } catch (e) {
        for (const m of made) {
          held.delete(m.handle.data);
          deviceData.delete(m.handle.data);
        }
        throw e;
      }
      return made.map((m) => m.handle);
    },
    async zeros(entries) {
      entries.forEach((e, i) => {
        if (!e.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `zeros ${String(i)}: shape [${e.shape.join(', ')}] is not a list of sizes`);
      });
      const c = await live();
      await ensureDevice(c);
      const made = entries.map((e) => newHandle(e.dtype, e.shape, undefined));
      try {
        await c.request({ op: 'alloc', allocs: entries.map((e, i) => ({ id: made[i]!.id, dtype: e.dtype, shape: e.shape })) });
      } catch (e) {
        for (const m of made) {
          held.delete(m.handle.data);
          deviceData.delete(m.handle.data);
        }
        throw e;
      }
      return made.map((m) => m.handle);
    },
    write(writes) {
      if (closed) return Promise.reject(new RuntimeError(RuntimeCode.DISPOSED, `${name} was closed`));
      if (writes.length === 0) return Promise.resolve();
      // On the live worker with its device tensors in place: sent now, so it goes before any run
      // requested after this call.
      if (conn.alive && deviceGeneration === generation) {
        let f;
        try {
          f = writeFrame(writes);
        } catch (e) {
          return Promise.reject(e instanceof Error ? e : new RuntimeError(RuntimeCode.BAD_VALUE, String(e)));
        }
        return conn.request(f.header, f.tensors).then(() => undefined);
      }
      return (async () => {
        const c = await live();
        // A new worker's tensors are restored from the restorers (which already give these contents).
        await ensureDevice(c);
        const f = writeFrame(writes);
        await c.request(f.header, f.tensors);
      })();
    },
    onRestore(restore) {
      restorers.push(restore);
    },
    holds: (t) => deviceData.has(t.data),
    bytes() {
      let n = 0;
      for (const w of deviceLive) {
        const d = w.deref();
        if (d === undefined) deviceLive.delete(w);
        else n += deviceData.get(d)!.bytes;
      }
      return n;
    },
  };
  /** The worker's last reported counters (`CacheStore.stats`); a new worker starts them again. */
  const workerStats: Record<string, number> = {};
  const residentFrame = (inputs: Readonly<Record<string, HostTensor>>, opts: RunOptions | undefined): { header: { resident: Record<string, number>; store: Record<string, number>; drop: number[] }; tensors: Record<string, HostTensor>; unsent: () => void } => {
    const tensors: Record<string, HostTensor> = {};
    const refs: Record<string, number> = {};
    const store: Record<string, number> = {};
    const sent: object[] = [];
    for (const [k, t] of Object.entries(inputs)) {
      if (deviceData.has(t.data)) {
        // On the device only: always by id (never sent, whatever `resident` says).
        const h = held.get(t.data);
        if (h === undefined) throw new RuntimeError(RuntimeCode.WORKER_FAILED, `input '${k}' is a device tensor the worker does not hold`);
        if (runKeyOf(t) !== h.key) throw new RuntimeError(RuntimeCode.BAD_VALUE, `input '${k}' is a device tensor ${h.key}, passed as ${keyOf(t)}`);
        refs[k] = h.id;
        continue;
      }
      if (opts?.resident?.has(k) !== true) {
        tensors[k] = t;
        continue;
      }
      const key = runKeyOf(t);
      const gen = inputGeneration(t.data);
      const was = held.get(t.data);
      if (was?.generation === gen && was.key === key) {
        refs[k] = was.id;
        continue;
      }
      // New, changed or reshaped: send it under a fresh id; the old copy goes.
      if (was !== undefined) drops.push(was.id);
      const id = nextId++;
      held.set(t.data, { id, generation: gen, key });
      collected.register(t.data, { id, generation });
      store[k] = id;
      tensors[k] = t;
      sent.push(t.data);
    }
    // A run that fails may not have stored them: forget them (and drop whatever the worker kept),
    // so the next run sends them again.
    const unsent = (): void => {
      for (const d of sent) held.delete(d);
      drops.push(...Object.values(store));
    };
    return { header: { resident: refs, store, drop: drops.splice(0) }, tensors, unsent };
  };
  /**
   * The `caches` part of a run: the streams and rows for the header, the seeds (`cache:<id>:<input>`)
   * of caches this worker lacks, and the cache-fed inputs' placeholders for the input checks.
   */
  const cacheFrame = (graph: Graph, inputs: Readonly<Record<string, HostTensor>>, run: CacheRun): { header: Record<string, unknown>; seeds: Record<string, HostTensor>; checked: Record<string, HostTensor> } => {
    // `graph` is the executor's own expansion, prepared once: its inputs never change.
    let declared = declaredInputs.get(graph);
    if (declared === undefined) declaredInputs.set(graph, (declared = new Map(graph.nodes.filter((n) => n.kind === 'input').map((n) => [n.name, graph.values[n.results[0]!]!.type]))));
    const ids = new Set<number>();
    const seeds: Record<string, HostTensor> = {};
    const lost: number[] = [];
    const rows = run.rows.map((r) => {
      if (ids.has(r.id)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache ${String(r.id)} is read by two rows of one run`);
      if (!open.has(r.id)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache ${String(r.id)} was never opened on ${name} or was released`);
      ids.add(r.id);
      named.add(r.id);
      const [from, count] = r.append;
      if (!Number.isSafeInteger(from) || !Number.isSafeInteger(count) || from < 0 || count < 0) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache ${String(r.id)}: append [${String(from)}, ${String(count)}) is not a range of positions`);
      const have = known.get(r.id);
      if (have !== r.length && !(have === undefined && r.length === 0)) {
        // The worker lacks it (a new worker) or holds another length: send the caller's copy.
        const content = r.restore?.();
        if (content === undefined) lost.push(r.id);
        for (const s of content === undefined ? [] : run.streams) {
          const t = content![s.input];
          if (t?.shape[0] !== r.length) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache ${String(r.id)}: restore gave no ${String(r.length)} positions of '${s.input}'`);
          seeds[`cache:${String(r.id)}:${s.input}`] = t;
        }
      }
      if (r.reserve !== undefined && !(Number.isSafeInteger(r.reserve) && r.reserve >= 0)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache ${String(r.id)}: reserve ${String(r.reserve)} is not a count of positions`);
      return { id: r.id, append: [from, count], seed: have !== r.length && r.length > 0, ...(r.reserve === undefined ? {} : { reserve: r.reserve }) };
    });
    if (lost.length > 0) {
      const what = lost.map((id) => `${String(id)} (${known.has(id) ? `holds ${String(known.get(id))} positions` : 'not held'})`).join(', ');
      throw new CacheLostError(lost, `${name} lost cache${lost.length === 1 ? '' : 's'} ${what}, and the run gives no restore for ${lost.length === 1 ? 'it' : 'them'}`);
    }
    const past = Math.max(0, ...run.rows.map((r) => r.length));
    const checked: Record<string, HostTensor> = { ...inputs };
    for (const s of run.streams) {
      const type = declared.get(s.input);
      if (type === undefined) throw new RuntimeError(RuntimeCode.UNKNOWN_INPUT, `cache stream '${s.input}' is not an input of @${graph.name}`);
      if (!type.shape.slice(2).every((d) => typeof d === 'number')) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache stream '${s.input}' (${typeToString(type)}) must have static dims after [rows, positions]`);
      const item = type.shape.slice(2) as number[];
      const tail = s.from === undefined ? inputs[s.input] : undefined;
      if (s.from === undefined && tail === undefined) throw new RuntimeError(RuntimeCode.MISSING_INPUT, `cache stream '${s.input}' takes its tail from the inputs, which lack it`);
      if (s.from !== undefined && inputs[s.input] !== undefined) throw new RuntimeError(RuntimeCode.BAD_VALUE, `'${s.input}' is fed from the caches: do not pass it as an input`);
      if (s.from !== undefined && !graph.outputs.some((o) => o.name === s.from)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `cache stream '${s.input}' appends from '${s.from}', which is not an output of @${graph.name}`);
      checked[s.input] = placeholder(type.dtype, [run.rows.length, past + (tail?.shape[1] ?? 0), ...item]);
    }
    return { header: { streams: run.streams.map((s) => ({ input: s.input, from: s.from ?? null, pad: s.pad, store: s.store ?? null })), rows, ...(run.rowInputs === undefined ? {} : { rowInputs: run.rowInputs }) }, seeds, checked };
  };
  const close = async (): Promise<void> => {
    closed = true;
    // A worker being started replaces `conn`: let it finish, then stop it.
    await starting?.catch(() => undefined);
    await conn.close();
  };
  return {
    name,
    capabilities,
    info,
    get pid() {
      return conn.alive ? conn.pid : undefined;
    },
    get rankPids() {
      return conn.alive ? conn.rankPids : [];
    },
    traffic: () => ({ ...counts, restarts: generation - 1 }),
    device: deviceTensors,
    caches: {
      open: () => {
        const id = nextCache++;
        open.add(id);
        return id;
      },
      release(ids: readonly number[]): void {
        // Only ids a request named: a cache opened and released unused (a prefix hit replaces the
        // one its sequence opened with a fork) never reached the worker, and costs no request.
        const gone = ids.filter((id) => open.delete(id) && named.delete(id));
        for (const id of gone) known.delete(id);
        // Also for caches not known yet: a run in flight may be creating them.
        if (gone.length > 0 && conn.alive && !closed) {
          const c = conn;
          c.request({ op: 'cache_drop', ids: gone }).then(
            (reply) => {
              if (c === conn) heldBy(reply.header);
            },
            () => undefined,
          );
        }
      },
      stats: () => ({ ...workerStats }),
      fork(from: number, length: number): number {
        checkCache('fork', from, length);
        const to = nextCache++;
        open.add(to);
        const have = known.get(from);
        // The worker lacks those positions (restarted, or a failed run left their count unknown):
        // the new cache is lost from the start, and its first run says so (CacheLostError).
        if (length === 0 || have === undefined || have < length || !conn.alive || closed) return to;
        named.add(to);
        cacheRequest(
          { op: 'cache_fork', from, to, length },
          () => {
            if (open.has(to)) known.set(to, length);
          },
          () => undefined,
        );
        return to;
      },
      keep(id: number, length: number): void {
        checkCache('keep', id, length);
        const have = known.get(id);
        if (have === undefined || have < length || !conn.alive || closed) {
          known.delete(id);
          return;
        }
        // Exactly `length` positions once the worker has it, before any later run.
        known.set(id, length);
        cacheRequest({ op: 'cache_keep', cache: id, length }, () => undefined, () => known.delete(id));
      },
      // A dead worker holds nothing (its caches go with it, even before the next one starts).
      holds: (id: number, length: number): boolean => conn.alive && !closed && open.has(id) && (known.get(id) ?? -1) >= length,
    },
    close,
    dispose: close,
    async prepare(source: Graph, weights?: ValueSource): Promise<TorchPreparedGraph> {
      // Composites the worker has no handler for (ops.py `OPS`) go as their primitive ops.
      const graph = expandFor(source, capabilities);
      const { values, bindings } = resolveWeights(graph, weights);
      const params: Record<string, HostTensor> = {};
      for (const [k, v] of values) {
        if (deviceData.has(v.data)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `parameter '${k}' of @${graph.name} is a device tensor: feed it as an input (by id), not as a parameter`);
        params[k] = v;
      }
      const json = graphToJson(graph);
      // The handle on the current worker; a new worker prepares the graph again (so the parameters stay referenced here).
      const onWorker = async (): Promise<{ handle: unknown; generation: number; fused: TorchFusion }> => {
        const c = await live();
        const gen = generation;
        const reply = await c.request({ op: 'prepare', graph: json }, params);
        const count = (k: string): number => (typeof reply.header[k] === 'number' ? reply.header[k] : 0);
        return { handle: reply.header['handle'], generation: gen, fused: { slotLinears: count('fusedSlotLinears'), slotSets: count('fusedSlotSets'), cacheConcats: count('cacheConcats'), collectives: count('collectives') } };
      };
      let current = await onWorker();
      // The resident map the last run sent to `current` (in the order requests leave): a run with
      // the same map says `residentSame` instead of sending its ~500 names again. Forgotten after a
      // failed run, so the next one sends the map whole.
      let lastResident: { readonly to: typeof current; readonly refs: Readonly<Record<string, number>> } | undefined;
      const f = current.fused;
      opts.log?.(`${name}: prepared @${graph.name}: ${String(f.slotLinears)} loraBankLinear ops on the bank kernel (${String(f.slotSets)} sets), ${String(f.cacheConcats)} in-place cache appends${ranks > 1 ? `, ${String(f.collectives)} collectives per run` : ''}`);
      let disposed = false;
      const gone = (): RuntimeError => new RuntimeError(RuntimeCode.DISPOSED, `@${graph.name} on ${name} was disposed`);
      return {
        executor: name,
        get fused(): TorchFusion {
          return current.fused;
        },
        async run(inputs: Readonly<Record<string, HostTensor>>, opts?: RunOptions): Promise<Record<string, HostTensor>> {
          if (disposed || closed) throw gone();
          const c = await live();
          await ensureDevice(c);
          if (current.generation !== generation) current = await onWorker();
          if (cacheOps.size > 0) await Promise.all(cacheOps);
          // After `live`: a new worker holds no caches, so what to seed is decided against it.
          const caches = opts?.caches === undefined ? undefined : cacheFrame(graph, inputs, opts.caches);
          checkInputs(graph, caches?.checked ?? inputs, bindings);
          const floatOutput = (n: string): boolean => {
            const o = graph.outputs.find((x) => x.name === n);
            return o !== undefined && ['f32', 'f16', 'bf16', 'f64'].includes(graph.values[o.value]!.type.dtype);
          };
          const argmax = opts?.argmax ?? [];
          for (const n of argmax) {
            if (!floatOutput(n)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `argmax names '${n}', which is not a float output of @${graph.name}`);
          }
          const sample = opts?.sample ?? {};
          for (const [n, rows] of Object.entries(sample)) {
            if (!floatOutput(n)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `sample names '${n}', which is not a float output of @${graph.name}`);
            if (argmax.includes(n)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `'${n}' is named by both sample and argmax`);
            checkRowSamples(n, rows);
          }
          const omit = opts?.omit ?? [];
          for (const n of omit) {
            if (!graph.outputs.some((x) => x.name === n)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `omit names '${n}', which is not an output of @${graph.name}`);
            if (argmax.includes(n)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `'${n}' is named by both omit and argmax`);
            if (Object.hasOwn(sample, n)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `'${n}' is named by both omit and sample`);
          }
          const frame = residentFrame(inputs, opts);
          const { resident, store, drop } = frame.header;
          const same = lastResident?.to === current && Object.keys(store).length === 0 && sameRefs(lastResident.refs, resident);
          if (!same) lastResident = { to: current, refs: resident };
          const residentHeader = {
            ...(same ? { residentSame: true } : { resident }),
            ...(Object.keys(store).length === 0 ? {} : { store }),
            ...(drop.length === 0 ? {} : { drop }),
          };
          let out: { header: Record<string, unknown>; tensors: Record<string, HostTensor> };
          try {
            out = await c.request(
              { op: 'run', handle: current.handle, ...residentHeader, ...(caches === undefined ? {} : { caches: caches.header }), ...(argmax.length === 0 ? {} : { argmax }), ...(omit.length === 0 ? {} : { omit }), ...sampleHeader(sample) },
              caches === undefined ? frame.tensors : { ...frame.tensors, ...caches.seeds },
            );
          } catch (e) {
            lastResident = undefined;
            frame.unsent();
            // Whatever the worker appended is unknown now: re-send those caches when next read.
            for (const r of opts?.caches?.rows ?? []) known.delete(r.id);
            throw e;
          }
          for (const r of opts?.caches?.rows ?? []) if (open.has(r.id)) known.set(r.id, r.length + r.append[1]);
          // The worker's counters (its cache batch, its step graphs) come with every run's reply.
          const reported = out.header['stats'];
          if (typeof reported === 'object' && reported !== null) for (const [k, v] of Object.entries(reported)) if (typeof v === 'number') workerStats[k] = v;
          const result: Record<string, HostTensor> = {};
          for (const o of graph.outputs) {
            if (omit.includes(o.name)) continue;
            const t = out.tensors[o.name];
            if (t === undefined) throw new RuntimeError(RuntimeCode.WORKER_FAILED, `torch worker: the reply lacks output '${o.name}'`);
            result[o.name] = t;
          }
          return result;
        },
        dispose(): void {
          if (disposed) return;
          disposed = true;
          if (conn.alive && current.generation === generation) conn.request({ op: 'dispose', handle: current.handle }).catch(() => undefined);
        },
      };
    },
  };
}

/** Whether two resident maps ({input name: id}) name the same ids for the same inputs. */
function sameRefs(a: Readonly<Record<string, number>>, b: Readonly<Record<string, number>>): boolean {
  let n = 0;
  for (const k in b) {
    if (a[k] !== b[k]) return false;
    n++;
  }
  return n === Object.keys(a).length;
}

/** Per prepared graph, its inputs' types by name (built once: a run reads it for its cache streams). */
const declaredInputs = new WeakMap<Graph, ReadonlyMap<string, TensorType>>();

/**
 * `RunOptions.sample` as the run request's `sample` header: per output, the rows' parameters as
 * columns (JSON numbers: a draw's float64 crosses exactly).
 */
function sampleHeader(sample: Readonly<Record<string, readonly RowSample[]>>): { sample?: Record<string, Record<string, unknown[]>> } {
  const names = Object.keys(sample);
  if (names.length === 0) return {};
  const out: Record<string, Record<string, unknown[]>> = {};
  for (const n of names) {
    const rows = sample[n]!;
    out[n] = { temperature: rows.map((r) => r.temperature), topK: rows.map((r) => r.topK), topP: rows.map((r) => r.topP), u: rows.map((r) => r.u) };
    // Each row's logits processing, or null (only when some row has one).
    if (rows.some((r) => r.processing !== undefined)) out[n]['processing'] = rows.map((r) => r.processing ?? null);
  }
  return { sample: out };
}

/** Whether Python 3 with torch is found here (the interpreter the torch executor would use). */
export function isTorchAvailable(python?: string): boolean {
  try {
    findPython(python);
    return true;
  } catch {
    return false;
  }
}
