import { type AttrSpec, type AttrValue, normalizeAttrs } from './attrs.js';
import { type Dim, dimToString, parseDim } from './dim.js';
import { IrCode, IrError, StageError } from './errors.js';
import type { Graph, GraphNode, GraphOutput, ValueInfo } from './graph.js';
import { isOpKey, opDef } from './ops/index.js';
import { printFloat } from './print.js';
import type { TensorType } from './types.js';
import { verifyGraph } from './verify.js';
import { errorMessage } from './error-classes.js';

/** Version of the JSON graph format this build writes and reads. */
export const GRAPH_JSON_VERSION = 1;

/** The `format` tag of a JSON graph document. */
export const GRAPH_JSON_FORMAT = 'stageml.graph';

type JsonDim = number | string;
interface JsonType {
  dtype: string;
  shape: JsonDim[];
}
interface JsonResult {
  name: string;
  type: JsonType;
}
interface JsonNode {
  kind: 'input' | 'param' | 'op';
  op?: string;
  operands: number[];
  attrs?: Record<string, unknown>;
  results: JsonResult[];
}
/** The JSON document form of a graph (docs/ir.md §JSON). */
export interface GraphJson {
  format: typeof GRAPH_JSON_FORMAT;
  version: number;
  name: string;
  nodes: JsonNode[];
  outputs: { name: string; value: number }[];
}

const dimJson = (d: Dim): JsonDim => (typeof d === 'number' ? d : dimToString(d));
const floatJson = (x: number): number | string => (Number.isFinite(x) && !Object.is(x, -0) ? x : printFloat(x));

function attrJson(spec: AttrSpec, v: AttrValue): unknown {
  switch (spec.kind) {
    case 'float':
      return floatJson(v as number);
    case 'floats':
      return (v as number[]).map(floatJson);
    case 'dim':
      return dimJson(v as Dim);
    case 'dims':
      return (v as Dim[]).map(dimJson);
    case 'bool':
    case 'int':
    case 'enum':
    case 'ints':
    case 'dtype':
      return v;
  }
}

/** Converts a graph to its JSON document (plain data; `JSON.stringify` it to write). */
export function graphToJson(g: Graph): GraphJson {
  return {
    format: GRAPH_JSON_FORMAT,
    version: GRAPH_JSON_VERSION,
    name: g.name,
    nodes: g.nodes.map((n) => {
      const results = n.results.map((id) => {
        const v = g.values[id]!;
        return { name: v.name, type: { dtype: v.type.dtype, shape: v.type.shape.map(dimJson) } };
      });
      if (n.kind !== 'op') return { kind: n.kind, operands: [], results };
      const def = opDef(n.op);
      const attrs: Record<string, unknown> = {};
      for (const [k, spec] of Object.entries(def.attrs)) {
        const v = n.attrs[k];
        if (v !== undefined) attrs[k] = attrJson(spec, v);
      }
      return { kind: 'op', op: def.name, operands: [...n.operands], attrs, results };
    }),
    outputs: g.outputs.map((o) => ({ name: o.name, value: o.value })),
  };
}

/** Serializes a graph to a JSON string. */
export function serializeGraph(g: Graph): string {
  return JSON.stringify(graphToJson(g));
}

function bad(path: string, msg: string): never {
  throw new IrError(IrCode.BAD_JSON, `${path}: ${msg}`);
}

function obj(x: unknown, path: string): Record<string, unknown> {
  if (typeof x !== 'object' || x === null || Array.isArray(x)) bad(path, 'expected an object');
  return x as Record<string, unknown>;
}
function arr(x: unknown, path: string): unknown[] {
  if (!Array.isArray(x)) bad(path, 'expected an array');
  return x;
}
function str(x: unknown, path: string): string {
  if (typeof x !== 'string') bad(path, 'expected a string');
  return x;
}
function int(x: unknown, path: string): number {
  if (typeof x !== 'number' || !Number.isSafeInteger(x)) bad(path, 'expected an integer');
  return x;
}

function readDim(x: unknown, path: string): Dim {
  if (typeof x === 'number') return int(x, path);
  try {
    return parseDim(str(x, path));
  } catch (e) {
    if (e instanceof StageError) throw new IrError(IrCode.BAD_JSON, `${path}: ${e.message}`, { cause: e });
    throw e;
  }
}

function readFloat(x: unknown, path: string): number {
  if (typeof x === 'number') return x;
  const special: Record<string, number> = { nan: Number.NaN, inf: Infinity, '-inf': -Infinity, '-0': -0 };
  const s = str(x, path);
  const v = special[s];
  if (v === undefined) bad(path, `expected a number, nan, inf, -inf or -0, got '${s}'`);
  return v;
}

function readAttr(spec: AttrSpec, x: unknown, path: string): unknown {
  switch (spec.kind) {
    case 'float':
      return readFloat(x, path);
    case 'floats':
      return arr(x, path).map((v, i) => readFloat(v, `${path}[${String(i)}]`));
    case 'dim':
      return readDim(x, path);
    case 'dims':
      return arr(x, path).map((v, i) => readDim(v, `${path}[${String(i)}]`));
    case 'bool':
    case 'int':
    case 'enum':
    case 'ints':
    case 'dtype':
      return x;
  }
}

function readType(x: unknown, path: string): TensorType {
  const o = obj(x, path);
  return {
    dtype: str(o['dtype'], `${path}.dtype`) as TensorType['dtype'],
    shape: arr(o['shape'], `${path}.shape`).map((d, i) => readDim(d, `${path}.shape[${String(i)}]`)),
  };
}

/**
 * Reads a graph from its JSON document (a string or parsed data) and verifies it. Malformed
 * documents are `IR_BAD_JSON` naming the JSON path; other versions are `IR_JSON_VERSION`.
 */
export function deserializeGraph(input: unknown): Graph {
  let doc: unknown = input;
  if (typeof input === 'string') {
    try {
      doc = JSON.parse(input);
    } catch (e) {
      throw new IrError(IrCode.BAD_JSON, `not JSON: ${errorMessage(e)}`, { cause: e });
    }
  }
  const root = obj(doc, '$');
  if (root['format'] !== GRAPH_JSON_FORMAT) bad('$.format', `expected "${GRAPH_JSON_FORMAT}"`);
  if (root['version'] !== GRAPH_JSON_VERSION) {
    throw new IrError(IrCode.JSON_VERSION, `graph JSON version ${JSON.stringify(root['version'])} is not supported (this build reads ${String(GRAPH_JSON_VERSION)})`);
  }
  const name = str(root['name'], '$.name');
  const nodes: GraphNode[] = [];
  const values: ValueInfo[] = [];
  arr(root['nodes'], '$.nodes').forEach((raw, i) => {
    const path = `$.nodes[${String(i)}]`;
    const o = obj(raw, path);
    const kind = o['kind'];
    const results = arr(o['results'], `${path}.results`).map((r, k) => {
      const ro = obj(r, `${path}.results[${String(k)}]`);
      const id = values.length;
      values.push({ name: str(ro['name'], `${path}.results[${String(k)}].name`), type: readType(ro['type'], `${path}.results[${String(k)}].type`), node: i, index: k });
      return id;
    });
    const operands = arr(o['operands'], `${path}.operands`).map((v, k) => int(v, `${path}.operands[${String(k)}]`));
    if (kind === 'input' || kind === 'param') {
      nodes.push({ kind, name: values[results[0] ?? -1]?.name ?? bad(path, 'needs one result'), operands, results });
      return;
    }
    if (kind !== 'op') bad(`${path}.kind`, 'expected "input", "param" or "op"');
    const opName = str(o['op'], `${path}.op`);
    const key = opName.startsWith('sml.') ? opName.slice(4).replace(/_([a-z0-9])/g, (_m, c: string) => c.toUpperCase()) : opName;
    if (!isOpKey(key)) throw new IrError(IrCode.UNKNOWN_OP, `${path}.op: unknown op '${opName}'`, { at: { graph: name, node: i } });
    const def = opDef(key);
    const rawAttrs = o['attrs'] === undefined ? {} : obj(o['attrs'], `${path}.attrs`);
    const attrs: Record<string, AttrValue> = {};
    for (const [k, v] of Object.entries(rawAttrs)) {
      const spec = def.attrs[k];
      attrs[k] = (spec === undefined ? v : readAttr(spec, v, `${path}.attrs.${k}`)) as AttrValue;
    }
    nodes.push({ kind: 'op', op: key, operands, attrs: normalizeAttrs(def.name, def.attrs, attrs, { graph: name, node: i }), results });
  });
  const outputs: GraphOutput[] = arr(root['outputs'], '$.outputs').map((raw, i) => {
    const o = obj(raw, `$.outputs[${String(i)}]`);
    return { name: str(o['name'], `$.outputs[${String(i)}].name`), value: int(o['value'], `$.outputs[${String(i)}].value`) };
  });
  const g: Graph = { name, nodes, values, outputs };
  verifyGraph(g);
  return g;
}
