import { type Graph, type HostTensor, StageError, evalDim, errorMessage } from '@stageml/ir';
import { type ExternalTensor, OnnxCode, type OnnxModel, type OnnxRuleTable, encodeOnnx, lowerToOnnx } from '@stageml/onnx-lower';

import { RuntimeCode, RuntimeError } from '../errors.js';
import { type PreparedGraph, checkInputs, resolveWeights } from '../executor.js';
import type { ValueSource } from '../values.js';
import type { OrtModule, OrtSession, OrtSessionOptions, OrtTensor } from './binding.js';
import { emptyOrtTensor, fromOrtTensor, toOrtTensor } from './tensors.js';

/** What `prepareOnOrt` needs besides the graph: the loaded binding and the resolved options. */
export interface OrtPrepareConfig {
  readonly ort: OrtModule;
  readonly session: OrtSessionOptions;
  readonly rules: OnnxRuleTable | undefined;
  /** Hand onnxruntime output tensors of the exact shape (computed from the run's dims) to write into. */
  readonly preallocateOutputs: boolean;
}

/**
 * Preallocated outputs: each output whose dims evaluate under the run's bindings gets a tensor of
 * that shape, so onnxruntime writes results there instead of allocating them (the KV cache of a
 * decode step); others are left to onnxruntime (null). `direct` marks outputs that are graph inputs
 * or initializers, which onnxruntime does not copy into a preallocated tensor.
 */
function outputTensors(cfg: OrtPrepareConfig, model: OnnxModel, direct: ReadonlySet<string>, bindings: Readonly<Record<string, number>>): Record<string, OrtTensor | null> {
  const fetches: Record<string, OrtTensor | null> = {};
  for (const spec of model.outputs) {
    let dims: number[] | undefined;
    try {
      dims = direct.has(spec.name) ? undefined : spec.shape.map((d) => evalDim(d, bindings));
    } catch {
      dims = undefined;
    }
    fetches[spec.name] = dims === undefined ? null : emptyOrtTensor(cfg.ort, spec.dtype, dims);
  }
  return fetches;
}

function detail(e: unknown): string {
  return e instanceof StageError ? `${String(e.code)}: ${e.message}` : errorMessage(e);
}

function lower(graph: Graph, values: ReadonlyMap<string, HostTensor>, rules: OnnxRuleTable | undefined): OnnxModel {
  try {
    return lowerToOnnx(graph, { weights: { get: (n) => values.get(n) }, ...(rules === undefined ? {} : { rules }) });
  } catch (e) {
    const at = e instanceof StageError ? e.at : undefined;
    const code = e instanceof StageError && e.code === OnnxCode.UNSUPPORTED_OP ? RuntimeCode.UNSUPPORTED_OP : RuntimeCode.EVAL_FAILED;
    throw new RuntimeError(code, `cannot run @${graph.name} on onnxruntime: ${detail(e)}`, { cause: e, at });
  }
}

/** Initializers of at least this many bytes reach onnxruntime as in-memory external data. */
const EXTERNAL_MIN_BYTES = 1024;

/**
 * Creates the session from a small ModelProto whose large initializers are ONNX external data
 * handed over in memory (`externalData` of the session options: one buffer per tensor, views of the
 * weights, never concatenated), so no protobuf holds the weights and no 2 GiB limit applies.
 * Returns the session and the buffers, which stay referenced as long as the session lives.
 */
async function createSession(graph: Graph, model: OnnxModel, cfg: OrtPrepareConfig): Promise<{ session: OrtSession; buffers: readonly ExternalTensor[] }> {
  const encoded = encodeOnnx(model, { externalData: { location: (_name, i) => `initializer${String(i)}.bin`, threshold: EXTERNAL_MIN_BYTES } });
  try {
    const session = await cfg.ort.InferenceSession.create(encoded.model, { ...cfg.session, externalData: encoded.external.map((e) => ({ path: e.location, data: e.data })) });
    return { session, buffers: encoded.external };
  } catch (e) {
    throw new RuntimeError(RuntimeCode.EVAL_FAILED, `onnxruntime could not create a session for @${graph.name}: ${detail(e)}`, { cause: e });
  }
}

/**
 * Prepares `graph` on onnxruntime: resolves the parameters, lowers the graph to ONNX with the
 * parameters as initializers (they stay resident in the session), and creates one inference
 * session. Runs convert the inputs to their compute types (sharing float storage), run the session
 * and convert the outputs back.
 */
export async function prepareOnOrt(graph: Graph, weights: ValueSource | undefined, cfg: OrtPrepareConfig): Promise<PreparedGraph> {
  const { values, bindings: paramBindings } = resolveWeights(graph, weights);
  const model = lower(graph, values, cfg.rules);
  const { session, buffers } = await createSession(graph, model, cfg);
  const direct = new Set([...model.inputs.map((i) => i.name), ...model.initializers.map((t) => t.name)]);
  // NOTE: the state holds the in-memory external data until dispose, in case onnxruntime reads it lazily.
  const state: { disposed: boolean; buffers: readonly ExternalTensor[] } = { disposed: false, buffers };
  const ensureLive = (): void => {
    if (state.disposed) throw new RuntimeError(RuntimeCode.DISPOSED, `this onnxruntime prepared graph @${graph.name} was disposed`);
  };
  return {
    executor: 'onnxruntime',
    async run(inputs: Readonly<Record<string, HostTensor>>): Promise<Record<string, HostTensor>> {
      ensureLive();
      const bindings = checkInputs(graph, inputs, paramBindings);
      const feeds: Record<string, OrtTensor> = {};
      for (const spec of model.inputs) feeds[spec.name] = toOrtTensor(cfg.ort, inputs[spec.name]!);
      let out: Readonly<Record<string, OrtTensor>>;
      try {
        out = cfg.preallocateOutputs ? await session.run(feeds, outputTensors(cfg, model, direct, bindings)) : await session.run(feeds);
      } catch (e) {
        ensureLive();
        throw new RuntimeError(RuntimeCode.EVAL_FAILED, `running @${graph.name} on onnxruntime failed: ${detail(e)}`, { cause: e });
      }
      const result: Record<string, HostTensor> = {};
      for (const spec of model.outputs) result[spec.name] = fromOrtTensor(out[spec.name]!, spec.dtype);
      return result;
    },
    dispose(): void {
      if (state.disposed) return;
      state.disposed = true;
      session.release().then(
        () => {
          state.buffers = [];
        },
        () => undefined,
      );
    },
  };
}
