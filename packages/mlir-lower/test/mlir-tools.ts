import { type Graph, type HostTensor, graphInputs, interpret } from '@stageml/ir';
import { type MlirTools, type RunnerCall, findMlirTools, runMlirOnCpu, verifyMlir } from '../src/index.js';

/**
 * The upstream MLIR tools, or a failure naming what to install. These tests never skip: on CI a
 * missing toolchain is a failure, and locally it fails with the same message.
 */
export function requireMlirTools(): MlirTools {
  const r = findMlirTools();
  if (r.status === 'missing') throw new Error(`the MLIR tests need upstream MLIR 19: ${r.reason}; ${r.hint}`);
  if (r.tools.cpuRunner === undefined || r.tools.runnerLibs.length === 0) {
    throw new Error(`the MLIR tests need mlir-cpu-runner-19 and the runner libraries (libmlir_runner_utils, libmlir_c_runner_utils): install mlir-19-tools and libmlir-19, or set STAGEML_MLIR_CPU_RUNNER and STAGEML_MLIR_LIB_DIR`);
  }
  return r.tools;
}

/**
 * A lazily started, shared computation: every test that needs a batch awaits it, so a missing
 * toolchain fails each of those tests (rather than a hook that would leave them skipped).
 */
export function once<T>(f: () => Promise<T>): () => Promise<T> {
  let p: Promise<T> | undefined;
  return () => (p ??= f());
}

/** Runs calls on the CPU runner; on a batch failure, finds the first call that fails alone. */
export async function runOrExplain(calls: readonly RunnerCall[], tools: MlirTools): Promise<Record<string, HostTensor>[]> {
  const r = await runMlirOnCpu(calls, tools);
  if (r.status === 'ok') return r.outputs.map((o) => ({ ...o }));
  for (const c of calls) {
    const alone = await runMlirOnCpu([c], tools);
    if (alone.status !== 'ok') throw new Error(`@${c.fn.name} fails at ${alone.stage}:\n${alone.diagnostics.slice(0, 4000)}\n\n${c.fn.text.slice(0, 6000)}`);
  }
  throw new Error(`the batch fails at ${r.stage} although every call passes alone:\n${r.diagnostics.slice(0, 4000)}`);
}

/** Verifies a module through the LLVM pipeline, failing with mlir-opt's diagnostics. */
export async function expectVerifies(text: string, tools: MlirTools): Promise<void> {
  const r = await verifyMlir(text, tools, { pipeline: 'llvm' });
  if (!r.ok) throw new Error(`mlir-opt rejected the module:\n${r.diagnostics.slice(0, 4000)}`);
}

/** The reference interpreter's outputs for `values` (inputs and parameters by name). */
export function reference(g: Graph, values: Readonly<Record<string, HostTensor>>): Record<string, HostTensor> {
  const inputs: Record<string, HostTensor> = {};
  for (const n of graphInputs(g)) inputs[n.name] = values[n.name]!;
  return interpret(g, { inputs, weights: values });
}
