import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { traceGraph } from './builder.js';
import { IrCode } from './errors.js';
import { GRAPH_JSON_FORMAT, GRAPH_JSON_VERSION, deserializeGraph, graphToJson, serializeGraph } from './json.js';

const g = traceGraph('g', (b) => {
  const x = b.input('x', ['f32', ['batch', 4]]);
  const w = b.param('w', ['f32', [3, 4]]);
  const y = b.linear(x, w);
  return { y: b.slice(b.reshape(y, [-1]), 0, 1), k: b.constant([Number.NaN, -0, Number.POSITIVE_INFINITY], 'f32', [3]) };
});

/** The JSON document of `g`, changed by `f`. */
function docWith(f: (doc: Record<string, unknown> & { nodes: Record<string, unknown>[] }) => void): string {
  const doc = JSON.parse(serializeGraph(g)) as Record<string, unknown> & { nodes: Record<string, unknown>[] };
  f(doc);
  return JSON.stringify(doc);
}

describe('graphToJson', () => {
  test('tags the document with its format and version', () => {
    const doc = graphToJson(g);
    expect(doc.format).toBe(GRAPH_JSON_FORMAT);
    expect(doc.version).toBe(GRAPH_JSON_VERSION);
  });

  test('writes symbolic dims as text, printed op names, and non-finite floats as strings', () => {
    const doc = graphToJson(g);
    expect(doc.nodes[0]).toEqual({ kind: 'input', operands: [], results: [{ name: 'x', type: { dtype: 'f32', shape: ['batch', 4] } }] });
    expect(doc.nodes[2]).toMatchObject({ kind: 'op', op: 'sml.linear', operands: [0, 1] });
    expect(doc.nodes[3]).toMatchObject({ op: 'sml.reshape', results: [{ type: { shape: ['3*batch'] } }] });
    expect(doc.nodes.find((n) => n.op === 'sml.constant')?.attrs).toEqual({ value: ['nan', '-0', 'inf'], shape: [3], dtype: 'f32' });
  });
});

describe('deserializeGraph', () => {
  test('reads back exactly what serializeGraph wrote, −0 and NaN included', () => {
    expect(deserializeGraph(serializeGraph(g))).toEqual(g);
  });

  test.each([0, 2, '1', null, undefined])('rejects version %j with IR_JSON_VERSION', (version) => {
    expectCode(() => deserializeGraph(docWith((d) => (d['version'] = version))), IrCode.JSON_VERSION);
  });

  test('rejects text that is not JSON with IR_BAD_JSON', () => {
    expectCode(() => deserializeGraph('{"format": '), IrCode.BAD_JSON);
  });

  test.each<[string, unknown]>([
    ['a number', 42],
    ['an array', []],
    ['null', null],
  ])('rejects %s as the document with IR_BAD_JSON', (_what, doc) => {
    expectCode(() => deserializeGraph(doc), IrCode.BAD_JSON);
  });

  test.each<[string, (d: Record<string, unknown> & { nodes: Record<string, unknown>[] }) => void, string]>([
    ['a wrong format tag', (d) => (d['format'] = 'onnx'), '$.format'],
    ['a missing name', (d) => delete d['name'], '$.name'],
    ['nodes that are not a list', (d) => ((d as Record<string, unknown>)['nodes'] = {}), '$.nodes'],
    ['a node that is not an object', (d) => ((d.nodes as unknown[])[1] = 'param'), '$.nodes[1]'],
    ['a bad node kind', (d) => (d.nodes[1]!['kind'] = 'weight'), '$.nodes[1].kind'],
    ['a fractional operand', (d) => (d.nodes[2]!['operands'] = [0, 1.5]), '$.nodes[2].operands[1]'],
    ['a result without a name', (d) => (d.nodes[0]!['results'] = [{ type: { dtype: 'f32', shape: [] } }]), '$.nodes[0].results[0].name'],
    ['a hostile, deeply nested dim string', (d) => (d.nodes[0]!['results'] = [{ name: 'x', type: { dtype: 'f32', shape: [`${'-'.repeat(50000)}1`, 4] } }]), '$.nodes[0].results[0].type.shape[0]'],
    ['a malformed dim string', (d) => (d.nodes[0]!['results'] = [{ name: 'x', type: { dtype: 'f32', shape: ['batch +', 4] } }]), '$.nodes[0].results[0].type.shape[0]'],
    ['a non-numeric float', (d) => ((d.nodes[5]!['attrs'] as Record<string, unknown>)['value'] = ['nan', 'big', 1]), '$.nodes[5].attrs.value[1]'],
    ['outputs that are not a list', (d) => (d['outputs'] = 'y'), '$.outputs'],
    ['an output without a value', (d) => (d['outputs'] = [{ name: 'y' }]), '$.outputs[0].value'],
  ])('rejects %s with IR_BAD_JSON naming the JSON path', (_what, f, path) => {
    const e = expectCode(() => deserializeGraph(docWith(f)), IrCode.BAD_JSON);
    expect(e.message.startsWith(`${path}:`), e.message).toBe(true);
  });

  test.each(['sml.frobnicate', 'frobnicate', 'sml.Linear'])('rejects op %j with IR_UNKNOWN_OP', (op) => {
    const e = expectCode(() => deserializeGraph(docWith((d) => (d.nodes[2]!['op'] = op))), IrCode.UNKNOWN_OP);
    expect(e.at).toMatchObject({ graph: 'g', node: 2 });
  });

  test('verifies what it reads (a recorded type that disagrees is IR_TYPE_MISMATCH)', () => {
    const text = docWith((d) => (d.nodes[2]!['results'] = [{ name: 'linear', type: { dtype: 'f32', shape: ['batch', 4] } }]));
    expectCode(() => deserializeGraph(text), IrCode.TYPE_MISMATCH);
  });

  test('rejects unknown attributes with IR_BAD_ATTR', () => {
    expectCode(() => deserializeGraph(docWith((d) => (d.nodes[2]!['attrs'] = { bias: true }))), IrCode.BAD_ATTR);
  });
});
