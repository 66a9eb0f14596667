import * as tf from '@tensorflow/tfjs-core';
import {
  expandDecomposed,
  type DType,
  type Graph,
  type HostTensor,
  type NodeRef,
  type OpNode,
  type TensorType,
  type ValueId,
  StageError,
  concretizeAttrs,
  opDef,
  errorMessage,
} from '@stageml/ir';

import { RuntimeCode, RuntimeError } from '../errors.js';
import { type PreparedGraph, checkInputs, resolveWeights } from '../executor.js';
import type { ValueSource } from '../values.js';
import { type TfjsBackend, isCurrent, useBackend } from './backend.js';
import { conformDType, download, needsConform, upload } from './dtypes.js';
import type { Kernel, LowerContext, Lowering, TfDType, TfRuleTable } from './rule.js';

/** One node of the execution plan. */
type Step =
  | { readonly kind: 'leaf'; readonly source: 'input' | 'param'; readonly name: string; readonly value: ValueId; readonly free: readonly ValueId[] }
  | {
      readonly kind: 'op';
      readonly node: OpNode;
      readonly at: NodeRef;
      readonly rule: Lowering<OpNode['op']>;
      /** Compiled at prepare time; undefined when attributes need the run's symbol bindings. */
      readonly kernel: Kernel | undefined;
      readonly types: { readonly operands: readonly TensorType[]; readonly results: readonly TensorType[] };
      /** Result dtypes that need rounding or wrapping after the kernel (undefined: none). */
      readonly conform: readonly (DType | undefined)[];
      readonly free: readonly ValueId[];
    };

/** Tensors a prepared graph owns until `dispose`: parameters, kept lowering tensors, scalars. */
class Residents {
  readonly set = new Set<tf.Tensor>();
  readonly #scalars = new Map<string, tf.Scalar>();

  keep<T extends tf.Tensor>(t: T): T {
    this.set.add(tf.keep(t));
    return t;
  }

  scalar(value: number, dtype: TfDType = 'float32'): tf.Scalar {
    const key = `${dtype}:${String(value)}`;
    let s = this.#scalars.get(key);
    if (s === undefined) {
      s = this.keep(tf.scalar(value, dtype));
      this.#scalars.set(key, s);
    }
    return s;
  }

  dispose(): void {
    for (const t of this.set) t.dispose();
    this.set.clear();
    this.#scalars.clear();
  }
}

function nodeRef(graph: Graph, index: number, node: OpNode): NodeRef {
  return { graph: graph.name, node: index, value: graph.values[node.results[0]!]?.name };
}

function failure(graph: Graph, step: Extract<Step, { kind: 'op' }>, backend: TfjsBackend, e: unknown): RuntimeError {
  const detail = e instanceof StageError ? `${e.code}: ${e.message}` : errorMessage(e);
  return new RuntimeError(RuntimeCode.EVAL_FAILED, `${opDef(step.node.op).name} (%${String(step.at.value)}) failed on tfjs-${backend}: ${detail}`, {
    at: step.at,
    cause: e,
  });
}

/** For each node, the values whose last use it is (outputs are never freed; unused results die at birth). */
function freeLists(graph: Graph): ValueId[][] {
  const last = new Int32Array(graph.values.length).fill(-1);
  graph.values.forEach((v, id) => {
    last[id] = v.node;
  });
  graph.nodes.forEach((n, i) => {
    for (const v of n.operands) last[v] = i;
  });
  for (const o of graph.outputs) last[o.value] = graph.nodes.length;
  const lists = graph.nodes.map(() => [] as ValueId[]);
  last.forEach((i, id) => {
    if (i < graph.nodes.length) lists[i]!.push(id);
  });
  return lists;
}

/**
 * Prepares `graph` on an already loaded tfjs `backend` with the lowerings of `rules`: checks every
 * op is supported (`RT_UNSUPPORTED_OP` naming the op and executor), resolves and uploads the
 * parameters once as resident tensors, and compiles every node whose attributes are static.
 */
export async function prepareOnTfjs(source: Graph, weights: ValueSource | undefined, backend: TfjsBackend, rules: TfRuleTable): Promise<PreparedGraph> {
  // Composites the table runs by decomposition become their primitive ops first.
  const graph = expandDecomposed(source, rules);
  const executor = `tfjs-${backend}`;
  graph.nodes.forEach((n, i) => {
    if (n.kind !== 'op') return;
    const rule = rules[n.op];
    if (rule.kind === 'unsupported') {
      throw new RuntimeError(RuntimeCode.UNSUPPORTED_OP, `${opDef(n.op).name} is not supported by the ${executor} executor: ${rule.reason}`, {
        at: nodeRef(graph, i, n),
      });
    }
  });
  const { values: weightValues, bindings: paramBindings } = resolveWeights(graph, weights);
  while (!isCurrent(backend)) await useBackend(backend);

  const residents = new Residents();
  const params = new Map<string, tf.Tensor>();
  const steps: Step[] = [];
  const frees = freeLists(graph);
  const typeOf = (v: ValueId): TensorType => graph.values[v]!.type;
  try {
    tf.tidy(() => {
      graph.nodes.forEach((n, i) => {
        const free = frees[i]!;
        if (n.kind !== 'op') {
          if (n.kind === 'param') params.set(n.name, residents.keep(upload(weightValues.get(n.name)!, true)));
          steps.push({ kind: 'leaf', source: n.kind, name: n.name, value: n.results[0]!, free });
          return;
        }
        const rule = rules[n.op] as Lowering<OpNode['op']>;
        const types = { operands: n.operands.map(typeOf), results: n.results.map(typeOf) };
        const at = nodeRef(graph, i, n);
        const conform = types.results.map((t) => (!rule.exact && needsConform(t.dtype) ? t.dtype : undefined));
        let attrs: Record<string, unknown> | undefined;
        try {
          attrs = concretizeAttrs(opDef(n.op).attrs, n.attrs, paramBindings);
        } catch {
          // A dim attribute mentions a symbol only the run's inputs bind: compile per run.
          attrs = undefined;
        }
        const ctx: LowerContext = { backend, ...types, scalar: (v, dt) => residents.scalar(v, dt), keep: (t) => residents.keep(t) };
        const step = { kind: 'op', node: n, at, rule, kernel: undefined, types, conform, free } as const;
        let kernel: Kernel | undefined;
        try {
          kernel = attrs === undefined ? undefined : rule.lower(attrs, ctx);
        } catch (e) {
          throw failure(graph, step, backend, e);
        }
        steps.push({ ...step, kernel });
      });
    });
  } catch (e) {
    residents.dispose();
    throw e;
  }

  const scalarSource = (v: number, dt?: TfDType): tf.Scalar => residents.scalar(v, dt);
  // An object, so checks after an `await` see a dispose() that happened meanwhile.
  const state = { disposed: false };

  /** Runs every step synchronously inside one tidy scope; returns the output tensors (owned by the caller). */
  function execute(inputs: Readonly<Record<string, HostTensor>>, bindings: Readonly<Record<string, number>>): tf.Tensor[] {
    return tf.tidy(() => {
      const env = new Array<tf.Tensor | undefined>(graph.values.length);
      for (const step of steps) {
        if (step.kind === 'leaf') {
          env[step.value] = step.source === 'param' ? params.get(step.name)! : upload(inputs[step.name]!, false);
        } else {
          const xs = step.node.operands.map((v) => env[v]!);
          let ys: tf.Tensor[];
          try {
            const kernel =
              step.kernel ??
              step.rule.lower(concretizeAttrs(opDef(step.node.op).attrs, step.node.attrs, bindings), {
                backend,
                ...step.types,
                scalar: (v, dt) => tf.scalar(v, dt),
                keep: (t) => t,
              });
            ys = kernel(xs).map((y, k) => {
              const dtype = step.conform[k];
              const out = dtype === undefined ? y : conformDType(y, dtype, scalarSource);
              // NOTE: a kernel may hand back an operand (identity casts); the value then needs its
              // own tensor, or freeing the operand after its last use would free the result too.
              return xs.includes(out) ? tf.clone(out) : out;
            });
          } catch (e) {
            throw failure(graph, step, backend, e);
          }
          step.node.results.forEach((id, k) => {
            env[id] = ys[k];
          });
        }
        for (const v of step.free) {
          const t = env[v];
          if (t !== undefined && !residents.set.has(t)) t.dispose();
          env[v] = undefined;
        }
      }
      // Resident tensors (parameters, constants) returned as outputs are copied: the caller disposes outputs.
      return graph.outputs.map((o) => {
        const t = env[o.value]!;
        return residents.set.has(t) ? tf.clone(t) : t;
      });
    });
  }

  /** Throws `RT_DISPOSED` once `dispose()` was called (also after an `await`, hence a call). */
  function ensureLive(): void {
    if (state.disposed) throw new RuntimeError(RuntimeCode.DISPOSED, `this ${executor} prepared graph @${graph.name} was disposed`);
  }

  return {
    executor,
    async run(inputs: Readonly<Record<string, HostTensor>>): Promise<Record<string, HostTensor>> {
      ensureLive();
      const bindings = checkInputs(graph, inputs, paramBindings);
      // NOTE: tfjs has one global engine; a graph runs on the backend it was prepared for. The
      // kernels run synchronously after this check, so no other caller can switch in between.
      while (!isCurrent(backend)) await useBackend(backend);
      ensureLive();
      const outs = execute(inputs, bindings);
      try {
        const data = await Promise.all(outs.map((t) => t.data()));
        const result: Record<string, HostTensor> = {};
        graph.outputs.forEach((o, i) => {
          result[o.name] = download(data[i]!, typeOf(o.value).dtype, outs[i]!.shape);
        });
        return result;
      } finally {
        for (const t of outs) t.dispose();
      }
    },
    dispose(): void {
      if (state.disposed) return;
      state.disposed = true;
      residents.dispose();
      params.clear();
    },
  };
}
