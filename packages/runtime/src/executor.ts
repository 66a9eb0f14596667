import { COMPOSITE_OPS, type DType, OP_KEYS, type Graph, type HostTensor, type OpKey, type WeightStore, bindDims, expandComposites, graphInputs, graphParams, typeToString, errorMessage } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';
import type { RowsInput } from './row-inputs.js';
import { type ValueSource, toStore } from './values.js';

/** A graph prepared once on an executor and run many times. */
export interface PreparedGraph {
  /** Name of the executor (and backend) that runs it, e.g. `tfjs-wasm`. */
  readonly executor: string;
  /** Runs the graph on named inputs; resolves to named outputs as host tensors. */
  run(inputs: Readonly<Record<string, HostTensor>>, opts?: RunOptions): Promise<Record<string, HostTensor>>;
  /** Releases executor-resident memory; later `run` calls fail with `RT_DISPOSED`. */
  dispose(): void;
  /**
   * The inputs a run may give per row (`RunOptions.rows`), read in place: on cpu-native, those
   * read only as cached attention's position-major caches. Absent: none.
   */
  readonly rowInputs?: ReadonlySet<string>;
}

/** Options of one `PreparedGraph.run`. */
export interface RunOptions {
  /**
   * Inputs the caller keeps as the same data objects from run to run, mutating them in place only
   * followed by `inputChanged(data)` (weights fed as inputs, adapter slot tables). An executor whose
   * memory is not the host's (the torch worker) sends such an input once and keeps it between runs
   * until it changes or its data object is garbage-collected; in-process executors ignore it.
   */
  readonly resident?: ReadonlySet<string>;
  /**
   * Inputs fed from caches the executor holds (`Executor.caches`: per-sequence KV kept where the
   * executor computes), instead of from `inputs`; only executors with `caches` accept it.
   */
  readonly caches?: CacheRun;
  /**
   * Inputs given per row (`RowsInput`: each row's leading positions in a buffer of its own)
   * instead of in `inputs`, which must not name them too. Only inputs the prepared graph lists in
   * `rowInputs` may be: cpu-native refuses any other with `RT_BAD_VALUE`, and an executor that lists
   * none does not read `rows` (the run misses the input: `RT_MISSING_INPUT`). Give such inputs
   * joined (`joinRows`).
   */
  readonly rows?: Readonly<Record<string, RowsInput>>;
  /**
   * An earlier result of this prepared graph that the caller no longer reads: the executor may
   * write this run's outputs into its storage instead of allocating new buffers (a decode step's
   * logits and KV outputs every step, which is garbage-collector pressure that slows the whole
   * process). The record's tensors must not be read after this call, nor be passed to another
   * run. A hint: executors that cannot reuse it (or find it too small, or overlapping an input)
   * allocate as usual. The cpu-native executor reuses it.
   */
  readonly recycle?: Readonly<Record<string, HostTensor>>;
  /**
   * Float outputs of which the caller needs only, per row, the index of the maximum along the last
   * axis (a greedy pick from logits). An executor whose results cross to the host (the torch
   * worker) returns such an output as i64 of the leading dims instead, computed where it ran, and
   * so does the cpu-native executor (in its addon, not in a JavaScript loop over the row); other
   * in-process executors return the values. Read either with `argmaxRows`.
   */
  readonly argmax?: readonly string[];
  /**
   * Float outputs of which the caller needs only, per row, one token drawn from the last axis
   * (`RowSample`, one per row: greedy or sampled picks from logits). An executor whose results
   * cross to the host (the torch worker) returns such an output as i64 of the leading dims instead,
   * each row's pick made where it ran with `samplePick`'s arithmetic (@stageml/models); in-process
   * executors return the values, and the caller picks. Names none of `argmax` or `omit`.
   */
  readonly sample?: Readonly<Record<string, readonly RowSample[]>>;
  /**
   * Outputs the caller does not read. An executor whose results cross to the host (the torch
   * worker) leaves them where they were computed and its result lacks them: a decode step's new
   * keys and values, which the executor's caches append anyway (`CacheRun`), then never cross.
   * In-process executors may return them. Each must be an output of the graph and not in `argmax`.
   */
  readonly omit?: readonly string[];
}

/**
 * How one row's token is drawn from an output's last axis (`RunOptions.sample`): `temperature` 0 is
 * the greedy pick (`firstMaxIndex`'s rule); above 0, a draw from the softmax at that temperature over
 * the `topK` largest (0: all) cut to the nucleus `topP` (1: all), at the point `u` in [0, 1) of the
 * kept mass.
 */
export interface RowSample {
  readonly temperature: number;
  readonly topK: number;
  readonly topP: number;
  readonly u: number;
  /** Logits processing before the pick (`RowProcessing`); none when absent. */
  readonly processing?: RowProcessing;
}

/**
 * A row's logits processing before its pick, as `makePicker` of @stageml/models applies it (in
 * float64, in this order): `logitBias` added; with `repetitionPenalty` (not 1) each `seen` token's
 * positive logit divided by it, a negative one multiplied; each `counts` token's logit less
 * `frequencyPenalty` × its count, then less `presencePenalty`. Ids are distinct within each list;
 * ids past the vocabulary are skipped.
 */
export interface RowProcessing {
  readonly logitBias?: readonly (readonly [number, number])[];
  readonly repetitionPenalty?: number;
  readonly seen?: readonly number[];
  readonly frequencyPenalty?: number;
  readonly presencePenalty?: number;
  readonly counts?: readonly (readonly [number, number])[];
}

/** Checks `RunOptions.sample`'s rows; a bad one is `RT_BAD_VALUE` naming the output and row. */
export function checkRowSamples(name: string, rows: readonly RowSample[]): void {
  if (!Array.isArray(rows) || rows.length === 0) throw new RuntimeError(RuntimeCode.BAD_VALUE, `sample '${name}' needs one row spec per row, got ${Array.isArray(rows) ? 'none' : typeof rows}`);
  rows.forEach((spec: unknown, i) => {
    const bad = (what: string, v: unknown): never => {
      throw new RuntimeError(RuntimeCode.BAD_VALUE, `sample '${name}' row ${String(i)}: ${what}, got ${String(v)}`);
    };
    if (typeof spec !== 'object' || spec === null) return bad('a row spec is an object', spec);
    // NOTE: read as numbers whatever a JavaScript caller passed; each check below refuses a non-number.
    const r = spec as Record<'temperature' | 'topK' | 'topP' | 'u', number>;
    if (!(Number.isFinite(r.temperature) && r.temperature >= 0)) bad('temperature must be a finite number >= 0', r.temperature);
    if (!(Number.isInteger(r.topK) && r.topK >= 0 && r.topK < 2 ** 31)) bad('topK must be an integer >= 0', r.topK);
    if (!(r.topP > 0 && r.topP <= 1)) bad('topP must be in (0, 1]', r.topP);
    if (!(r.u >= 0 && r.u < 1)) bad('u must be in [0, 1)', r.u);
    const p = (spec as { processing?: unknown }).processing;
    if (p !== undefined) checkProcessing(p, bad);
  });
}

function checkProcessing(p: unknown, bad: (what: string, v: unknown) => never): void {
  if (typeof p !== 'object' || p === null) return bad('processing is an object', p);
  const q = p as Record<string, unknown>;
  const isId = (v: unknown): boolean => Number.isInteger(v) && (v as number) >= 0 && (v as number) < 2 ** 31;
  const finite = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v);
  // What a bad list held, for the message (never its contents: it may be anything).
  const shape = (v: unknown): string => (Array.isArray(v) ? `a list of ${String(v.length)}` : typeof v);
  const distinct = (ids: readonly unknown[], what: string): void => {
    if (new Set(ids).size !== ids.length) bad(`${what} ids must be distinct`, ids.length);
  };
  const pairs = (v: unknown, what: string, second: (x: unknown) => boolean): void => {
    if (v === undefined) return;
    if (!Array.isArray(v) || !v.every((e) => Array.isArray(e) && e.length === 2 && isId(e[0]) && second(e[1]))) bad(`${what} must be [id, value] pairs`, shape(v));
    distinct((v as unknown[][]).map((e) => e[0]), what);
  };
  pairs(q['logitBias'], 'logitBias', finite);
  pairs(q['counts'], 'counts', (c) => Number.isInteger(c) && (c as number) >= 1);
  if (q['seen'] !== undefined) {
    if (!Array.isArray(q['seen']) || !q['seen'].every(isId)) bad('seen must be token ids', shape(q['seen']));
    distinct(q['seen'] as unknown[], 'seen');
  }
  const rep = q['repetitionPenalty'];
  if (rep !== undefined && !(finite(rep) && (rep as number) > 0)) bad('repetitionPenalty must be a positive number', rep);
  for (const k of ['frequencyPenalty', 'presencePenalty']) if (q[k] !== undefined && !finite(q[k])) bad(`${k} must be a finite number`, q[k]);
}

/**
 * Per row of an output a run was asked to reduce (`RunOptions.argmax`), the index of its maximum:
 * the executor's own (an i64 tensor), or computed here over the last axis. Both take the first
 * entry no later entry exceeds (`argmaxOf` of @stageml/models: ties the lowest index; a NaN never
 * exceeds, nor is exceeded where it comes first).
 */
export function argmaxRows(t: HostTensor): number[] {
  if (t.dtype === 'i64') return Array.from(t.data);
  const n = t.shape.length === 0 ? 1 : t.shape[t.shape.length - 1]!;
  const rows = n === 0 ? 0 : t.data.length / n;
  return Array.from({ length: rows }, (_, r) => firstMaxIndex(t.data, r * n, n));
}

/**
 * The index (from `start`) of the first maximum of `values[start, start + n)`: the first entry no
 * later entry exceeds (ties the lowest index; a NaN never exceeds, nor is exceeded where it comes
 * first). The rule of every greedy pick: `argmaxRows` here, `argmaxOf` in @stageml/models, the torch
 * worker's `argmax_rows`.
 */
export function firstMaxIndex(values: ArrayLike<number>, start = 0, n = values.length - start): number {
  let best = 0;
  let bv = values[start]!;
  for (let i = 1; i < n; i++) {
    const v = values[start + i]!;
    if (v > bv) {
      best = i;
      bv = v;
    }
  }
  return best;
}

/**
 * Caches an executor holds between runs (a sequence's keys, values and key mask, kept on the
 * executor's device): each is named by an id from `open`, read by runs that name it in
 * `RunOptions.caches` and appended by them; `release` frees it.
 */
export interface CacheStore {
  /** A fresh cache id (the cache starts empty). */
  open(): number;
  /** Frees caches (unknown ids are ignored); ordered after every run already started. */
  release(ids: readonly number[]): void;
  /**
   * Counters of how the executor holds the caches and runs the steps over them (the torch worker:
   * `restages`, `joins`, `gathers`, `graphCaptures`, `graphReplays`, …, as of the last run, and
   * `caches`, how many caches it holds, as of the last `release`, `fork` or `keep` it answered);
   * absent where the executor keeps none.
   */
  stats?(): Readonly<Record<string, number>>;
  /**
   * A new cache (a fresh id, as `open` gives) holding the first `length` positions of cache
   * `from`, copied where the caches live (the executor's device): prefix caching seeds a sequence
   * from a cached prefix this way without a host copy. Ordered before every run started after
   * it. Where the executor no longer holds `from` at `length` positions (a restarted worker) the
   * new cache is lost from the start: the first run over it fails with `CacheLostError` (and the
   * caller rebuilds it), never reading other positions. A `from` that was never opened or is
   * released, or a `length` that is not a count of positions, is `RT_BAD_VALUE`. Absent where the
   * executor cannot copy caches.
   */
  fork?(from: number, length: number): number;
  /**
   * Keeps cache `id` for reuse at its first `length` positions (a finished sequence's prefix):
   * the executor may free what it held beyond them and whatever it reserved for the cache to
   * grow. A later `fork` reads it; `release` frees it. Same errors as `fork`. Present with `fork`.
   */
  keep?(id: number, length: number): void;
  /**
   * Whether the executor holds cache `id` with at least `length` positions now (false after a
   * restarted worker lost it, or while a run that appended to it failed). Present with `fork`.
   */
  holds?(id: number, length: number): boolean;
}

/**
 * One stream of a cache: input `input` f32[rows, past, …item] is built from each row's cache
 * (positions beyond a row's length filled with `pad`) — followed along axis 1 by the run's own
 * `inputs[input]` (the tail, f32[rows, seq, …item]) when `from` is undefined; after the run each
 * row appends positions [from, from + count) of output `from` (or of the tail) to its cache.
 */
export interface CacheStream {
  readonly input: string;
  readonly from: string | undefined;
  readonly pad: number;
  /** Dtype the executor stores the stream in (default the input's; values must be exact in it). */
  readonly store?: DType;
}

/** One batch row of a run fed from caches. */
export interface CacheRow {
  /** The row's cache (`CacheStore.open`). */
  readonly id: number;
  /** Positions the caller's copy of the cache holds (what the row reads). */
  readonly length: number;
  /** The positions [from, from + count) of the row's outputs (or tails) this run appends. */
  readonly append: readonly [from: number, count: number];
  /**
   * Positions the row's cache is expected to reach (a hint; absent: unknown): an executor that
   * stages a persistent batch of caches at one capacity (the torch worker) sizes it for the rows'
   * expected lengths at once instead of growing it — and copying every row — as they decode.
   */
  readonly reserve?: number;
  /**
   * The cache's content, per stream input f32[length, …item], for an executor that lost it (a
   * restarted worker) or never had it: called only then. Absent (the caller keeps no copy), such a
   * run fails with `CacheLostError` (`RT_CACHE_LOST`) before anything is sent.
   */
  readonly restore?: () => Readonly<Record<string, HostTensor>>;
}

/** What `RunOptions.caches` names: the streams and the rows (`past` is the longest row's length). */
export interface CacheRun {
  readonly streams: readonly CacheStream[];
  readonly rows: readonly CacheRow[];
  /**
   * Inputs whose leading axis is the batch row (ids, positions, the key mask's tail, per-row slot
   * inputs): an executor that keeps a persistent batch of caches (the torch worker) may run a
   * step over its whole batch, scattering these rows to their batch rows (others get zeros) and
   * gathering the outputs back. Absent: the run's rows are run as given.
   */
  readonly rowInputs?: readonly string[];
}

const generations = new WeakMap<object, number>();

/** Marks `data`, an input fed as `resident`, as changed in place: executors keeping a copy refresh it at the next run. */
export function inputChanged(data: object): void {
  generations.set(data, (generations.get(data) ?? 0) + 1);
}

/** How many times `inputChanged` was called on `data` (for executors keeping resident inputs). */
export function inputGeneration(data: object): number {
  return generations.get(data) ?? 0;
}

/** What an executor runs and how: its table of ops, dtypes and picks, as planning and `prepare` read it. */
export interface ExecutorCapabilities {
  /** Executor name (`interpreter`, `onnxruntime`, `tfjs-wasm`, …). */
  readonly name: string;
  /**
   * The composite ops (`COMPOSITE_OPS`) it lowers itself; `prepare` expands every other composite
   * (and every op added with `registerOp`) into its decomposition first (`expandFor`). Absent:
   * none (a description for planning, or an executor of primitive ops only).
   */
  readonly fuses?: ReadonlySet<OpKey>;
  /** Whether the executor runs op `op` (itself or through its decomposition). */
  readonly supportsOp: (op: OpKey) => boolean;
  /** Whether factors may be bound at request time (inputs supplied per run). */
  readonly lateBinding: boolean;
  /**
   * Float dtypes its programs may compute in (what `Engine.load`'s `dtype` checks); undefined:
   * f32 only.
   */
  readonly dtypes?: readonly DType[];
  /**
   * Whether its runs make `RunOptions.sample` picks where the results are, and that is worth it:
   * the torch worker on CUDA (a sort and a few scans of the logits on the GPU against the whole
   * vocabulary's logits crossing to the host). Undefined: the caller picks from the values (on the
   * CPU torch worker the host's picks are faster: bench/results/torch-sample.md).
   */
  readonly devicePicks?: boolean;
  /**
   * What a scheduler over this executor should default to (`SchedulingHints`); undefined: the
   * host-CPU defaults `CPU_SCHEDULING`. Explicit options (`--max-num-batched-tokens`,
   * `--max-num-seqs`) override them.
   */
  readonly scheduling?: SchedulingHints;
}

/**
 * Defaults a scheduler takes from the executor it drives, as vLLM sizes `--max-num-batched-tokens`
 * and `--max-num-seqs` for the device: on a GPU a step of thousands of tokens costs little more
 * than one of a few (the weights are read once either way), on two CPU cores every token counts.
 */
export interface SchedulingHints {
  /** Most prompt tokens one step prefills over all its sequences (vLLM's max-num-batched-tokens). */
  readonly tokenBudget: number;
  /** Most sequences running together (vLLM's max-num-seqs). */
  readonly maxBatch: number;
}

/** The scheduling defaults of an executor that computes on the host CPU (and of unknown ones). */
export const CPU_SCHEDULING: SchedulingHints = { tokenBudget: 64, maxBatch: 32 };

/** The scheduling defaults of an executor on a CUDA GPU (`torch-cuda`). */
export const GPU_SCHEDULING: SchedulingHints = { tokenBudget: 8192, maxBatch: 256 };

/** Something that runs graphs: the reference interpreter, tfjs, onnxruntime, … */
export interface Executor {
  /** Executor name (with backend), e.g. `interpreter`, `tfjs-cpu`. */
  readonly name: string;
  /** What it runs (its table of fused composites, dtypes, picks). */
  readonly capabilities: ExecutorCapabilities;
  /**
   * Prepares `graph` with parameter data from `weights` (every parameter must resolve), after
   * expanding the composites it does not fuse (`expandFor`).
   */
  prepare(graph: Graph, weights?: ValueSource): Promise<PreparedGraph>;
  /** Caches held between runs (`RunOptions.caches`); absent: runs take every input from the host. */
  readonly caches?: CacheStore;
  /**
   * Releases what the executor holds: every graph it prepared (their runs then fail with
   * `RT_DISPOSED`) and its process or session state (the torch worker stops). Later `prepare`
   * calls fail with `RT_DISPOSED`. Idempotent.
   */
  dispose(): Promise<void>;
}

/** `graph` with every composite `caps` does not fuse replaced by its decomposition (what `prepare` compiles). */
export function expandFor(graph: Graph, caps: ExecutorCapabilities): Graph {
  const fuses = caps.fuses ?? new Set<OpKey>();
  return expandComposites(graph, (op) => !fuses.has(op));
}

/** The composites an exhaustive rule table lowers with a rule of its own (neither `unsupported` nor `decomposed`). */
export function fusedComposites(rules: Readonly<Record<OpKey, { readonly kind: string }>>): ReadonlySet<OpKey> {
  return new Set(COMPOSITE_OPS.filter((op) => rules[op].kind !== 'unsupported' && rules[op].kind !== 'decomposed'));
}

/**
 * Capabilities of an executor whose ops are the entries of an exhaustive rule table: it runs what
 * the table does not mark `unsupported`, fuses the composites with rules of their own, binds late
 * and computes in f32.
 */
export function capabilitiesOfTable(name: string, rules: Readonly<Record<OpKey, { readonly kind: string }>>): ExecutorCapabilities {
  const unsupported = new Set(OP_KEYS.filter((op) => rules[op].kind === 'unsupported'));
  return { name, fuses: fusedComposites(rules), supportsOp: (op) => !unsupported.has(op), lateBinding: true };
}

/**
 * The graphs an executor prepared and has not seen disposed, so `Executor.dispose` can release
 * them; `prepare` fails with `RT_DISPOSED` once the executor is disposed.
 */
export class PreparedGraphs {
  readonly #live = new Set<PreparedGraph>();
  #disposed = false;

  constructor(private readonly executor: string) {}

  /** Throws `RT_DISPOSED` when the executor was disposed. */
  check(): void {
    if (this.#disposed) throw new RuntimeError(RuntimeCode.DISPOSED, `the ${this.executor} executor was disposed`);
  }

  /** Keeps `p` until it is disposed (its `dispose` is wrapped to forget it); returns it. */
  track<P extends PreparedGraph>(p: P): P {
    if (this.#disposed) {
      p.dispose();
      this.check();
    }
    this.#live.add(p);
    const release = p.dispose.bind(p);
    p.dispose = (): void => {
      this.#live.delete(p);
      release();
    };
    return p;
  }

  /** Disposes every live prepared graph; later `check`/`track` calls fail with `RT_DISPOSED`. */
  disposeAll(): void {
    this.#disposed = true;
    for (const p of [...this.#live]) p.dispose();
  }
}

/**
 * Resolves every parameter of `graph` from `weights`, checking dtype and shape against the
 * declared types. Missing ones are `RT_MISSING_WEIGHT`, mistyped ones `RT_BAD_VALUE`.
 */
export function resolveWeights(graph: Graph, weights: ValueSource | undefined): { store: WeightStore; values: Map<string, HostTensor>; bindings: Record<string, number> } {
  const store = toStore(weights);
  const values = new Map<string, HostTensor>();
  const entries: { name: string; type: Graph['values'][number]['type']; value: HostTensor }[] = [];
  for (const p of graphParams(graph)) {
    const type = graph.values[p.results[0]!]!.type;
    const v = store.get(p.name);
    if (v === undefined) throw new RuntimeError(RuntimeCode.MISSING_WEIGHT, `parameter '${p.name}' (${typeToString(type)}) has no data`, { at: { graph: graph.name, value: p.name } });
    values.set(p.name, v);
    entries.push({ name: p.name, type, value: v });
  }
  try {
    return { store, values, bindings: bindDims(entries) };
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, errorMessage(e), { cause: e });
  }
}

/** Per graph, its input nodes and their names (`checkInputs`). */
const inputsOf = new WeakMap<Graph, { readonly nodes: number; readonly declared: ReturnType<typeof graphInputs>; readonly names: ReadonlySet<string> }>();

/**
 * Checks run-time inputs against a graph's signature: every input present (in `inputs`, or per row
 * in `rows`), none unknown, dtypes and shapes consistent with the declared types and with the
 * parameters' bindings. Returns the symbol bindings. Errors: `RT_MISSING_INPUT`,
 * `RT_UNKNOWN_INPUT`, `RT_BAD_VALUE` (also for an input given both ways).
 */
export function checkInputs(graph: Graph, inputs: Readonly<Record<string, HostTensor>>, paramBindings: Readonly<Record<string, number>> = {}, rows: Readonly<Record<string, RowsInput>> = {}): Record<string, number> {
  // NOTE: passes return new graphs, so a graph's input list is built once (an engine checks the
  // inputs of every decode step); a graph grown since (a builder's) is read again.
  let known = inputsOf.get(graph);
  if (known?.nodes !== graph.nodes.length) {
    const list = graphInputs(graph);
    inputsOf.set(graph, (known = { nodes: graph.nodes.length, declared: list, names: new Set(list.map((n) => n.name)) }));
  }
  const { declared, names } = known;
  for (const k of [...Object.keys(inputs), ...Object.keys(rows)]) {
    if (!names.has(k)) throw new RuntimeError(RuntimeCode.UNKNOWN_INPUT, `'${k}' is not an input of @${graph.name} (inputs: ${[...names].join(', ') || 'none'})`);
  }
  for (const k of Object.keys(rows)) {
    if (Object.hasOwn(inputs, k)) throw new RuntimeError(RuntimeCode.BAD_VALUE, `input '${k}' is given both as a tensor and per row`);
  }
  const entries = declared.map((n) => {
    const type = graph.values[n.results[0]!]!.type;
    const perRow = rows[n.name];
    // Per row: checked by dtype and shape (its rows by `checkRowsInput`).
    const value = perRow === undefined ? inputs[n.name] : { dtype: perRow.dtype, shape: perRow.shape };
    if (value === undefined) throw new RuntimeError(RuntimeCode.MISSING_INPUT, `input '${n.name}' (${typeToString(type)}) was not supplied`, { at: { graph: graph.name, value: n.name } });
    return { name: n.name, type, value };
  });
  try {
    return bindDims(entries, paramBindings);
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, errorMessage(e), { cause: e });
  }
}
