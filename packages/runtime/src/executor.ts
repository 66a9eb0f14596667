import { type Graph, type HostTensor, type WeightStore, bindDims, graphInputs, graphParams, typeToString, errorMessage } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from './errors.js';
import { type ValueSource, toStore } from './values.js';

/** A graph prepared once on an executor and run many times. */
export interface PreparedGraph {
  /** Name of the executor (and backend) that runs it, e.g. `tfjs-wasm`. */
  readonly executor: string;
  /** Runs the graph on named inputs; resolves to named outputs as host tensors. */
  run(inputs: Readonly<Record<string, HostTensor>>, opts?: RunOptions): Promise<Record<string, HostTensor>>;
  /** Releases executor-resident memory; later `run` calls fail with `RT_DISPOSED`. */
  dispose(): void;
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

/** Something that runs graphs: the reference interpreter, tfjs, onnxruntime, … */
export interface Executor {
  /** Executor name (with backend), e.g. `interpreter`, `tfjs-cpu`. */
  readonly name: string;
  /** Prepares `graph` with parameter data from `weights` (every parameter must resolve). */
  prepare(graph: Graph, weights?: ValueSource): Promise<PreparedGraph>;
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

/**
 * Checks run-time inputs against a graph's signature: every input present, none unknown, dtypes and
 * shapes consistent with the declared types and with the parameters' bindings. Returns the
 * symbol bindings. Errors: `RT_MISSING_INPUT`, `RT_UNKNOWN_INPUT`, `RT_BAD_VALUE`.
 */
export function checkInputs(graph: Graph, inputs: Readonly<Record<string, HostTensor>>, paramBindings: Readonly<Record<string, number>> = {}): Record<string, number> {
  const declared = graphInputs(graph);
  const names = new Set(declared.map((n) => n.name));
  for (const k of Object.keys(inputs)) {
    if (!names.has(k)) throw new RuntimeError(RuntimeCode.UNKNOWN_INPUT, `'${k}' is not an input of @${graph.name} (inputs: ${[...names].join(', ') || 'none'})`);
  }
  const entries = declared.map((n) => {
    const type = graph.values[n.results[0]!]!.type;
    const value = inputs[n.name];
    if (value === undefined) throw new RuntimeError(RuntimeCode.MISSING_INPUT, `input '${n.name}' (${typeToString(type)}) was not supplied`, { at: { graph: graph.name, value: n.name } });
    return { name: n.name, type, value };
  });
  try {
    return bindDims(entries, paramBindings);
  } catch (e) {
    throw new RuntimeError(RuntimeCode.BAD_VALUE, errorMessage(e), { cause: e });
  }
}
