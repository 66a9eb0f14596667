import { type DType, type HostTensor, rounderFor } from '@stageml/ir';

/** A value's type as the graph JSON form spells it. */
export interface CastValueType {
  readonly dtype: string;
  readonly shape: readonly (number | string)[];
}

/** Appends one op node (one result named `name` of `type`) to a graph being rebuilt; returns its value id. */
export type OpEmitter = (op: string, operands: number[], attrs: Record<string, unknown> | undefined, name: string, type: { dtype: string; shape: (number | string)[] }) => number;

/**
 * `rmsNorm(x, w)` and `rotary(x, cos, sin)` (not interleaved) re-emitted at `dtype` as Hugging
 * Face's Llama rounds them (LlamaRMSNorm, apply_rotary_pos_emb): `mul(rmsNorm(x), w)` and
 * `add(mul(x, cos), mul(concat(neg(x₂), x₁), sin))`, every op rounded. `operands` are the node's
 * operands in the rebuilt graph (already at `dtype`), `types` that graph's value types; returns
 * the id of the result (named as the original), or undefined for any other node — what
 * `stageml stage --dtype` (a residual) and the serving engine's bf16/f16 programs both apply.
 */
export function hfLlamaRounding(
  n: { readonly op?: string; readonly results: readonly { readonly name: string; readonly type: CastValueType }[] },
  operands: readonly number[],
  dtype: string,
  attrs: Record<string, unknown> | undefined,
  op1: OpEmitter,
  fresh: (base: string) => string,
  types: readonly CastValueType[],
): number | undefined {
  const r = n.results[0]!;
  const type = { dtype, shape: [...r.type.shape] };
  if (n.op === 'sml.rms_norm' && operands.length === 2) {
    const normed = op1('sml.rms_norm', [operands[0]!], attrs, fresh(`${r.name}.normed`), type);
    return op1('sml.mul', [normed, operands[1]!], undefined, r.name, type);
  }
  if (n.op === 'sml.rotary' && attrs?.['interleaved'] !== true && operands.length === 3) {
    const [x, c, s] = operands as [number, number, number];
    const xs = types[x]?.shape;
    const d = xs?.[xs.length - 1];
    if (xs === undefined || typeof d !== 'number' || d % 2 !== 0) return undefined;
    const axis = xs.length - 1;
    const half = { dtype, shape: [...xs.slice(0, -1), d / 2] };
    const x1 = op1('sml.slice', [x], { axis, start: 0, end: d / 2, step: 1 }, fresh(`${r.name}.x1`), half);
    const x2 = op1('sml.slice', [x], { axis, start: d / 2, step: 1 }, fresh(`${r.name}.x2`), half);
    const rot = op1('sml.concat', [op1('sml.neg', [x2], undefined, fresh(`${r.name}.neg`), half), x1], { axis }, fresh(`${r.name}.rotate_half`), { dtype, shape: [...xs] });
    const a = op1('sml.mul', [x, c], undefined, fresh(`${r.name}.cos`), type);
    const b = op1('sml.mul', [rot, s], undefined, fresh(`${r.name}.sin`), type);
    return op1('sml.add', [a, b], undefined, r.name, type);
  }
  return undefined;
}

/** Node indices in an order where each node follows the nodes defining its operands (stable otherwise). */
export function topoOrder(nodes: readonly { readonly operands: readonly number[] }[], values: readonly { readonly node: number }[]): number[] {
  const done = new Array<boolean>(nodes.length).fill(false);
  const order: number[] = [];
  const visit = (i: number): void => {
    if (done[i]) return;
    done[i] = true;
    for (const o of nodes[i]!.operands) visit(values[o]!.node);
    order.push(i);
  };
  for (let i = 0; i < nodes.length; i++) visit(i);
  return order;
}

/** `t` rounded to `dtype` (nearest even) in the IR's host storage of that dtype: a new tensor, or `t` itself when it already is `dtype`. */
export function roundedTensor(t: HostTensor, dtype: DType): HostTensor {
  if (t.dtype === dtype) return t;
  const round = rounderFor(dtype);
  const data = new Float32Array(t.data.length);
  for (let i = 0; i < data.length; i++) data[i] = round(t.data[i]!);
  return { dtype, shape: t.shape, data };
}
