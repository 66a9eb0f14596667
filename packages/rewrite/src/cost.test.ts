import { f32, parseGraph, sym } from '@stageml/ir';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { expectCode } from '@stageml/testkit';
import { describe, expect, test } from 'vitest';
import { RwCode, analyticCostModel, evalDimAt, loraServingSpec, residualCost } from './index.js';

const fixture = parseGraph(readFileSync(fileURLToPath(new URL('../../../fixtures/ir/lora-layer.ir', import.meta.url)), 'utf8'));

describe('analyticCostModel', () => {
  test('reads FLOPs and bytes from the registry at the given sizes, and takes the roofline max', () => {
    const model = analyticCostModel({ peakFlopsPerSecond: 1e12, bytesPerSecond: 1e9 });
    const c = model.opCost('matmul', [f32(['batch', 8]), f32([8, 16])], [f32(['batch', 16])], { transposeA: false, transposeB: false }, { batch: 4 });
    expect(c.flops).toBe(2 * 4 * 8 * 16);
    expect(c.bytes).toBe(4 * (4 * 8 + 8 * 16 + 4 * 16));
    expect(c.seconds).toBe(c.bytes / 1e9);
    const compute = analyticCostModel({ peakFlopsPerSecond: 1, bytesPerSecond: 1e12, opOverheadSeconds: 1 });
    expect(compute.opCost('neg', [f32([3])], [f32([3])], {}, {}).seconds).toBe(3 + 1);
  });

  test('costs a graph per request and sizes constants', () => {
    const model = analyticCostModel();
    const all = model.requestCost(fixture, { batch: 2 });
    expect(all.flops).toBe(15136 * 2);
    const some = model.requestCost(fixture, { batch: 2 }, (i) => fixture.nodes[i]!.kind === 'op' && (fixture.nodes[i] as { op: string }).op === 'add');
    expect(some.flops).toBe(2 * 96);
    expect(model.constantBytes(f32([96, 64]), {})).toBe(96 * 64 * 4);
  });

  test('rejects non-positive peaks and negative overheads with RW_BAD_OPTION', () => {
    expectCode(() => analyticCostModel({ peakFlopsPerSecond: 0 }), RwCode.BAD_OPTION);
    expectCode(() => analyticCostModel({ bytesPerSecond: Number.NaN }), RwCode.BAD_OPTION);
    expectCode(() => analyticCostModel({ opOverheadSeconds: -1 }), RwCode.BAD_OPTION);
  });
});

describe('evalDimAt', () => {
  test('evaluates symbolic dims, counting unsized symbols as 1', () => {
    expect(evalDimAt(sym('batch'), { batch: 3 })).toBe(3);
    expect(evalDimAt(sym('seq'), { batch: 3 })).toBe(1);
    expect(evalDimAt(7, {})).toBe(7);
  });
});

describe('residualCost', () => {
  test('counts only the work after the cutoff and the static values it reads', () => {
    const spec = loraServingSpec(fixture);
    const early = residualCost(fixture, { lattice: 'serving', annotations: spec, cutoff: 'adapter', sizes: { batch: 1 } });
    expect(early.dynamicOps).toBe(5);
    // w, bias, lora_A and lora_B are stored; the scalar 2 is re-emitted inline.
    expect(early.constantBytes).toBe(4 * (96 * 64 + 96 + 8 * 64 + 96 * 8));
    const late = residualCost(fixture, { lattice: 'serving', annotations: spec, cutoff: 'base', sizes: { batch: 1 } });
    expect(late.constantBytes).toBe(4 * (96 * 64 + 96));
    const none = residualCost(fixture, { lattice: 'serving', annotations: spec, cutoff: 'token' });
    expect(none).toMatchObject({ dynamicOps: 0, flops: 0, seconds: 0 });
  });
});
