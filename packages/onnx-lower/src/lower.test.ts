import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fromBinary } from '@bufbuild/protobuf';
import { GraphBuilder, OP_KEYS, hostTensor, type HostTensor, sym } from '@stageml/ir';
import { ModelProtoSchema, TensorProto_DataLocation, type ValueInfoProto } from 'onnx-buf';
import { describe, expect, it } from 'vitest';

import { ElemType, ONNX_IR_VERSION, ONNX_OPSET, ONNX_RULES, type OnnxRuleTable, encodeOnnx, lowerToOnnx, unsupported, writeOnnx } from './index.js';

const ramp = (shape: number[]): HostTensor => hostTensor('f32', shape, Array.from({ length: shape.reduce((a, d) => a * d, 1) }, (_, i) => i / 10));

function loraLayer() {
  const b = new GraphBuilder('lora');
  const x = b.input('x', ['f32', ['batch', 'seq', 8]]);
  const w = b.param('w', ['f32', [6, 8]]);
  const a = b.param('a', ['f32', [2, 8]]);
  const bb = b.param('b', ['f32', [6, 2]]);
  b.output('y', b.add(b.linear(x, w), b.mul(b.linear(b.linear(x, a), bb), b.scalar(0.5))));
  return { graph: b.build(), weights: { w: ramp([6, 8]), a: ramp([2, 8]), b: ramp([6, 2]) } };
}

function dims(v: ValueInfoProto): (string | number | undefined)[] {
  const t = v.type?.value;
  if (t?.case !== 'tensorType') return [];
  return (t.value.shape?.dim ?? []).map((d) => (d.value.case === 'dimValue' ? Number(d.value.value) : d.value.case === 'dimParam' ? d.value.value : undefined));
}

describe('ONNX_RULES', () => {
  it('has an entry for every op of the registry, in registry order', () => {
    expect(Object.keys(ONNX_RULES)).toEqual([...OP_KEYS]);
  });
});

describe('lowerToOnnx + encodeOnnx', () => {
  it('writes a ModelProto of the target opset with symbolic inputs, initializers and named outputs', () => {
    const { graph, weights } = loraLayer();
    const model = fromBinary(ModelProtoSchema, encodeOnnx(lowerToOnnx(graph, { weights })).model);
    expect(Number(model.irVersion)).toBe(ONNX_IR_VERSION);
    expect(model.opsetImport.map((o) => [o.domain, Number(o.version)])).toEqual([['', ONNX_OPSET]]);
    const g = model.graph!;
    expect(g.input.map((i) => [i.name, dims(i)])).toEqual([['x', ['batch', 'seq', 8]]]);
    expect(g.output.map((o) => [o.name, dims(o)])).toEqual([['y', ['batch', 'seq', 6]]]);
    const w = g.initializer.find((t) => t.name === 'w')!;
    expect(w.dataType).toBe(ElemType.FLOAT);
    expect(w.dims.map(Number)).toEqual([6, 8]);
    expect(Array.from(new Float32Array(w.rawData.slice().buffer))).toEqual(Array.from(weights.w.data));
    // The scalar constant is a shared initializer, copied to its value name by an Identity.
    expect(new Set(g.node.map((n) => n.opType))).toEqual(new Set(['Transpose', 'MatMul', 'Identity', 'Mul', 'Add']));
    // Tensor names follow the IR's value names; an output value is produced under the output's name.
    expect(g.node.find((n) => n.output.includes('y'))?.opType).toBe('Add');
    expect(g.node.filter((n) => n.output.includes('linear_1')).map((n) => n.opType)).toEqual(['MatMul']);
  });

  it('substitutes symbols bound by parameter shapes and declares composite dims as unknown', () => {
    const b = new GraphBuilder('bound');
    const x = b.input('x', ['f32', ['n', 'k']]);
    const past = b.input('past', ['f32', ['p', 'k']]);
    const w = b.param('w', ['f32', ['k', 3]]);
    b.output('y', b.matmul(b.concat([past, x], 0), w));
    const model = lowerToOnnx(b.build(), { weights: { w: ramp([4, 3]) } });
    expect(model.inputs.map((i) => i.shape)).toEqual([
      [expect.anything(), 4],
      [expect.anything(), 4],
    ]);
    const g = fromBinary(ModelProtoSchema, encodeOnnx(model).model).graph!;
    expect(g.input.map(dims)).toEqual([
      ['n', 4],
      ['p', 4],
    ]);
    expect(g.output.map(dims)).toEqual([[undefined, 3]]);
  });

  it('solves a symbol that only appears linearly in an input shape (past from past + seq)', () => {
    const b = new GraphBuilder('solve');
    const mask = b.input('mask', ['f32', ['past + seq']]);
    b.input('ids', ['i64', ['seq']]);
    b.output('head', b.slice(mask, 0, 0, sym('past')));
    const model = lowerToOnnx(b.build());
    const shapes = model.nodes.filter((n) => n.opType === 'Shape').map((n) => n.input[0]);
    expect(shapes.sort()).toEqual(['ids', 'mask']);
    const sub = model.nodes.find((n) => n.opType === 'Sub')!;
    expect(model.nodes.find((n) => n.opType === 'Slice')!.input[2]).toBe(sub.output[0]);
  });

  it('declares f16/bf16 and i8/u8 values in their compute types (float, int32)', () => {
    const b = new GraphBuilder('narrow');
    b.output('sum', b.add(b.input('h', ['f16', [2]]), b.input('g', ['f16', [2]])));
    b.output('wrapped', b.cast(b.input('i', ['i8', [2]]), 'u8'));
    const model = lowerToOnnx(b.build());
    expect(model.inputs.map((i) => i.elemType)).toEqual([ElemType.FLOAT, ElemType.FLOAT, ElemType.INT32]);
    expect(model.outputs.map((o) => [o.dtype, o.elemType])).toEqual([
      ['f16', ElemType.FLOAT],
      ['u8', ElemType.INT32],
    ]);
    // The f16 sum is rounded through FLOAT16 after the Add.
    expect(model.nodes.some((n) => n.opType === 'Cast' && n.attribute.some((a) => a.name === 'to' && a.i === BigInt(ElemType.FLOAT16)))).toBe(true);
  });

  it('moves large initializers to page-aligned external data', () => {
    const { graph, weights } = loraLayer();
    const enc = encodeOnnx(lowerToOnnx(graph, { weights }), { externalData: { location: 'm.onnx.data', threshold: 64 } });
    const g = fromBinary(ModelProtoSchema, enc.model).graph!;
    const external = g.initializer.filter((t) => t.dataLocation === TensorProto_DataLocation.EXTERNAL);
    expect(external.map((t) => t.name).sort()).toEqual(['a', 'w']);
    expect(enc.external.map((e) => e.name)).toEqual(external.map((t) => t.name));
    expect(enc.bytes.external).toBe(enc.external.reduce((n, e) => n + e.data.byteLength, 0));
    for (const t of external) {
      const entry = Object.fromEntries(t.externalData.map((e) => [e.key, e.value]));
      const placed = enc.external.find((e) => e.name === t.name)!;
      expect([entry['location'], Number(entry['offset']), Number(entry['length'])]).toEqual(['m.onnx.data', placed.offset, placed.data.byteLength]);
      expect(placed.offset % 4096).toBe(0);
      expect(Array.from(new Float32Array(placed.data.slice().buffer))).toEqual(Array.from(weights[t.name as 'w' | 'a'].data));
    }
    const perTensor = encodeOnnx(lowerToOnnx(graph, { weights }), { externalData: { location: (name) => `${name}.bin`, threshold: 16 } });
    expect(perTensor.external.map((e) => [e.location, e.offset])).toEqual([
      ['w.bin', 0],
      ['a.bin', 0],
      ['b.bin', 0],
    ]);
  });

  it('writes the model and its external data file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'onnx-lower-'));
    try {
      const { graph, weights } = loraLayer();
      const files = await writeOnnx(join(dir, 'lora.onnx'), lowerToOnnx(graph, { weights }), { externalData: true, threshold: 1 });
      expect(files.data).toBe(join(dir, 'lora.onnx.data'));
      const g = fromBinary(ModelProtoSchema, readFileSync(files.model)).graph!;
      const external = g.initializer.filter((t) => t.dataLocation === TensorProto_DataLocation.EXTERNAL);
      expect(external.length).toBeGreaterThanOrEqual(3);
      const data = readFileSync(files.data!);
      const b = external.find((t) => t.name === 'b')!;
      const offset = Number(b.externalData.find((e) => e.key === 'offset')!.value);
      expect(Array.from(new Float32Array(data.buffer.slice(data.byteOffset + offset, data.byteOffset + offset + 48)))).toEqual(Array.from(weights.b.data));
      await expect(writeOnnx(join(dir, 'missing', 'x.onnx'), lowerToOnnx(graph, { weights }))).rejects.toMatchObject({ code: 'ONNX_IO' });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('lowering errors', () => {
  it('names the op and the reason of an unsupported rule (ONNX_UNSUPPORTED_OP)', () => {
    const { graph, weights } = loraLayer();
    const rules: OnnxRuleTable = { ...ONNX_RULES, linear: unsupported('testing') };
    expect(() => lowerToOnnx(graph, { weights, rules })).toThrow(expect.objectContaining({ code: 'ONNX_UNSUPPORTED_OP', message: expect.stringContaining('sml.linear has no ONNX lowering: testing') }));
  });

  it('rejects missing and mistyped weights (ONNX_BAD_WEIGHT)', () => {
    const { graph, weights } = loraLayer();
    expect(() => lowerToOnnx(graph, { weights: { w: weights.w, a: weights.a } })).toThrow(expect.objectContaining({ code: 'ONNX_BAD_WEIGHT' }));
    expect(() => lowerToOnnx(graph, { weights: { ...weights, w: ramp([6, 7]) } })).toThrow(expect.objectContaining({ code: 'ONNX_BAD_WEIGHT' }));
  });

  it('rejects a symbolic dim no input determines (ONNX_UNBOUND_SYMBOL), naming the node', () => {
    const b = new GraphBuilder('unbound');
    b.output('y', b.add(b.input('x', ['f32', ['m * m']]), b.iota(['m * m'], 0, 'f32')));
    expect(() => lowerToOnnx(b.build())).toThrow(expect.objectContaining({ code: 'ONNX_UNBOUND_SYMBOL', at: expect.objectContaining({ graph: 'unbound' }) }));
  });

  it('rejects an output named like a different input (ONNX_BAD_GRAPH)', () => {
    const b = new GraphBuilder('clash');
    const x = b.input('x', ['f32', [2]]);
    b.output('x', b.neg(x));
    expect(() => lowerToOnnx(b.build())).toThrow(expect.objectContaining({ code: 'ONNX_BAD_GRAPH' }));
  });
});
