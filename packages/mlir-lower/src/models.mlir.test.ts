import { fileURLToPath } from 'node:url';
import { type HostTensor, hostTensor } from '@stageml/ir';
import { stagedModelGraph } from '@stageml/models';
import { type SpecializeResult, specialize } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { expectVerifies, once, reference, requireMlirTools, runOrExplain } from '../test/mlir-tools.js';
import { lowerFunction, lowerToMlir } from './index.js';

const fixture = (p: string): string => fileURLToPath(new URL(`../../../fixtures/peft-tiny/${p}`, import.meta.url));

async function adapterResidual(model: string, adapter: string, numLayers?: number): Promise<SpecializeResult> {
  const m = await stagedModelGraph(fixture(model), { adapter: fixture(adapter), ...(numLayers === undefined ? {} : { numLayers }) });
  return specialize(m.graph, { lattice: m.lattice, annotations: m.annotations, cutoff: 'adapter', values: { get: (n) => m.values.get(n) } });
}

function wave(shape: number[], scale: number, phase: number): HostTensor {
  const n = shape.reduce((a, b) => a * b, 1);
  return hostTensor('f32', shape, Array.from({ length: n }, (_, i) => scale * Math.sin(i * 0.37 + phase)));
}

/** Two rows of three new tokens after two cached positions; row 1 masks its first cached key. */
function decodeInputs(kvHeads: number, headDim: number): Record<string, HostTensor> {
  const [batch, past, seq] = [2, 2, 3];
  const masked = -3.4028234663852886e38;
  return {
    input_ids: hostTensor('i64', [batch, seq], [5, 17, 300, 42, 7, 511]),
    position_ids: hostTensor('i64', [batch, seq], [2, 3, 4, 1, 2, 3]),
    attention_mask: hostTensor('f32', [batch, past + seq], [0, 0, 0, 0, 0, masked, 0, 0, 0, 0]),
    'past_key.0': wave([batch, kvHeads, past, headDim], 1, 0.1),
    'past_value.0': wave([batch, kvHeads, past, headDim], 0.5, 0.7),
  };
}

describe('fixture models on the CPU runner', () => {
  const llamaInputs = decodeInputs(2, 16);
  const mixtralInputs = decodeInputs(2, 16);
  const batch = once(async () => {
    const tools = requireMlirTools();
    const llama = await adapterResidual('llama/base', 'llama/adapters/qv-r8', 1);
    const mixtral = await adapterResidual('mixtral/base', 'mixtral/adapters/experts-r4', 1);
    const outputs = await runOrExplain(
      [
        { fn: lowerFunction(llama.residual, llama.constants, { functionName: 'llama_layer' }), values: llamaInputs },
        { fn: lowerFunction(mixtral.residual, mixtral.constants, { functionName: 'mixtral_layer', constants: 'resources' }), values: mixtralInputs },
      ],
      tools,
    );
    return { llama, mixtral, outputs };
  });

  it('runs the adapter-stage residual of one Llama layer with the qv-r8 adapter as the interpreter does', { timeout: 180_000 }, async () => {
    const { llama, outputs } = await batch();
    const want = reference(llama.residual, { ...llamaInputs, ...llama.constants });
    expect(Object.keys(outputs[0]!).sort()).toEqual(['logits', 'present_key.0', 'present_value.0']);
    for (const [name, t] of Object.entries(want)) expect(outputs[0]![name], name).toBeAllclose(t, { rtol: 1e-5, atol: 1e-5 });
  });

  it('runs one Mixtral MoE layer with per-expert LoRA (topk, grouped matmuls, scatter-add) as the interpreter does', { timeout: 180_000 }, async () => {
    const { mixtral, outputs } = await batch();
    const ops = new Set(mixtral.residual.nodes.flatMap((n) => (n.kind === 'op' ? [n.op] : [])));
    for (const op of ['topk', 'groupedMatmul', 'scatterAdd', 'softmax', 'attention']) expect(ops.has(op as never), op).toBe(true);
    const want = reference(mixtral.residual, { ...mixtralInputs, ...mixtral.constants });
    for (const [name, t] of Object.entries(want)) expect(outputs[1]![name], name).toBeAllclose(t, { rtol: 1e-5, atol: 1e-5 });
  });

  it('lowers and verifies the whole fixture Llama residual in both constant modes', { timeout: 120_000 }, async () => {
    const tools = requireMlirTools();
    const whole = await adapterResidual('llama/base', 'llama/adapters/qv-r8');
    const args = lowerToMlir(whole.residual, whole.constants);
    const blobs = lowerToMlir(whole.residual, whole.constants, { constants: 'resources' });
    expect(args.function.arguments.filter((a) => a.kind === 'constant').length).toBeGreaterThan(20);
    // Weights never appear as text in the body: the module body stays small in both modes.
    expect(args.text.length).toBeLessThan(200_000);
    expect(blobs.text.slice(0, blobs.text.indexOf('{-#')).length).toBeLessThan(200_000);
    await Promise.all([expectVerifies(args.text, tools), expectVerifies(blobs.text, tools)]);
  });
});
