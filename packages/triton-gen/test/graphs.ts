// Small residual graphs with the patterns the generators recognize, built the way @stageml/peft
// and @stageml/moe build them (tests and bench/gpu share them).
import { type DType, type Graph, GraphBuilder } from '@stageml/ir';
import { moeBlock } from '@stageml/moe';
import { bankLinearGathered, bankLinearGrouped, loraLinear } from '@stageml/peft';

/** Dims of the test graphs. */
export interface Dims {
  readonly inDim: number;
  readonly outDim: number;
}

/** y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ (optionally with biases), rows symbolic. */
export function loraGraph(dtype: DType, d: Dims, rank: number, scale = 2, bias = false): Graph {
  const b = new GraphBuilder('lora');
  const x = b.input('x', [dtype, ['batch', d.inDim]]);
  const w = b.param('W', [dtype, [d.outDim, d.inDim]]);
  const bb = bias ? b.param('bias', [dtype, [d.outDim]]) : undefined;
  const A = b.param('A', [dtype, [rank, d.inDim]]);
  const B = b.param('B', [dtype, [d.outDim, rank]]);
  const biasB = bias ? b.param('bias_B', [dtype, [d.outDim]]) : undefined;
  b.output('y', loraLinear(b, x, w, bb, { A, B, scale, ...(biasB === undefined ? {} : { biasB }) }));
  return b.build();
}

/** SGMV bank: one row list and one adapter per group, ranks as given. */
export function bankGraph(dtype: DType, d: Dims, ranks: readonly number[]): Graph {
  const b = new GraphBuilder('bank');
  const x = b.input('x', [dtype, ['batch', d.inDim]]);
  const w = b.param('W', [dtype, [d.outDim, d.inDim]]);
  const groups = ranks.map((r, i) => ({
    rows: b.input(`rows${String(i)}`, ['i64', [`n${String(i)}`]]),
    lora: { A: b.param(`A${String(i)}`, [dtype, [r, d.inDim]]), B: b.param(`B${String(i)}`, [dtype, [d.outDim, r]]), scale: 0.5 + (i % 4) * 0.5 },
  }));
  b.output('y', bankLinearGrouped(b, x, w, undefined, groups));
  return b.build();
}

/** BGMV bank: stacked factors of `adapters` adapters of rank `rank`, one id per sequence. */
export function bgmvGraph(dtype: DType, d: Dims, adapters: number, rank: number, seq = 1): Graph {
  const b = new GraphBuilder('bgmv');
  const x = b.input('x', [dtype, ['batch', seq, d.inDim]]);
  const w = b.param('W', [dtype, [d.outDim, d.inDim]]);
  const stacked = {
    A: b.param('A', [dtype, [adapters, rank, d.inDim]]),
    B: b.param('B', [dtype, [adapters, d.outDim, rank]]),
    scales: b.param('S', [dtype, [adapters]]),
  };
  b.output('y', bankLinearGathered(b, x, w, undefined, stacked, b.input('ids', ['i64', ['batch']])));
  return b.build();
}

/** A Mixtral MoE block with expert LoRA on both projections. */
export function moeGraph(dtype: DType, hidden: number, inter: number, experts: number, rank: number): Graph {
  const b = new GraphBuilder('moe');
  const x = b.input('x', [dtype, ['T', hidden]]);
  const p = {
    router: b.param('router', [dtype, [experts, hidden]]),
    gateUp: b.param('gate_up', [dtype, [experts, 2 * inter, hidden]]),
    down: b.param('down', [dtype, [experts, hidden, inter]]),
    lora: {
      gate_up_proj: { A: b.param('gu_A', [dtype, [experts, rank, hidden]]), B: b.param('gu_B', [dtype, [experts, 2 * inter, rank]]), scale: 2 },
      down_proj: { A: b.param('dn_A', [dtype, [experts, rank, inter]]), B: b.param('dn_B', [dtype, [experts, hidden, rank]]), scale: 2 },
    },
  };
  b.output('y', moeBlock(b, x, p, { topK: 2 }));
  return b.build();
}

/** One routed expert projection with expert LoRA: groupedMatmul base + s·(x·A_gᵀ)·B_gᵀ. */
export function moeExpertGraph(dtype: DType, d: Dims, experts: number, rank: number, scale = 2): Graph {
  const b = new GraphBuilder('moe_expert');
  const x = b.input('x', [dtype, ['rows', d.inDim]]);
  const g = b.input('experts', ['i64', ['rows']]);
  const w = b.param('W', [dtype, [experts, d.outDim, d.inDim]]);
  const A = b.param('A', [dtype, [experts, rank, d.inDim]]);
  const B = b.param('B', [dtype, [experts, d.outDim, rank]]);
  const base = b.op('groupedMatmul', [x, w, g], { transposeW: true });
  const expand = b.op('groupedMatmul', [b.op('groupedMatmul', [x, A, g], { transposeW: true }), B, g], { transposeW: true });
  b.output('y', b.add(base, b.mul(expand, b.scalar(scale, dtype))));
  return b.build();
}
