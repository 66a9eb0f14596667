import { type AttrSpec, type AttrValue, isDefaultAttr } from './attrs.js';
import { type Dim, dimToString } from './dim.js';
import type { Graph, GraphNode } from './graph.js';
import { opDef } from './ops/index.js';
import { typeToString } from './types.js';

const BARE_RE = /^[A-Za-z0-9_.$\-/:]+$/;

/** Prints a name bare when it is a plain identifier, else as a JSON string. */
export function printName(name: string): string {
  // NOTE: a bare name must not start with `//`, which the parser skips as a comment.
  return BARE_RE.test(name) && !name.startsWith('//') ? name : JSON.stringify(name);
}

/** Text of a float that parses back to the identical number (NaN, ±inf and −0 included). */
export function printFloat(x: number): string {
  if (Number.isNaN(x)) return 'nan';
  if (x === Number.POSITIVE_INFINITY) return 'inf';
  if (x === Number.NEGATIVE_INFINITY) return '-inf';
  if (Object.is(x, -0)) return '-0';
  return String(x);
}

/** Text of one attribute value, per its spec. */
export function printAttr(spec: AttrSpec, v: AttrValue): string {
  switch (spec.kind) {
    case 'bool':
    case 'int':
      return JSON.stringify(v);
    case 'float':
      return printFloat(v as number);
    case 'enum':
      return JSON.stringify(v);
    case 'ints':
      return `[${(v as number[]).join(', ')}]`;
    case 'floats':
      return `[${(v as number[]).map(printFloat).join(', ')}]`;
    case 'dim':
      return dimToString(v as Dim);
    case 'dims':
      return `[${(v as Dim[]).map(dimToString).join(', ')}]`;
    case 'dtype':
      return v as string;
  }
}

function printNode(g: Graph, n: GraphNode): string {
  const results = n.results.map((id) => `%${printName(g.values[id]!.name)}`).join(', ');
  const types = n.results.map((id) => typeToString(g.values[id]!.type)).join(', ');
  if (n.kind === 'input' || n.kind === 'param') return `${results} = ${n.kind} : ${types}`;
  const def = opDef(n.op);
  const operands = n.operands.map((id) => `%${printName(g.values[id]!.name)}`).join(', ');
  const attrs: string[] = [];
  for (const [name, spec] of Object.entries(def.attrs)) {
    const v = n.attrs[name];
    if (v === undefined || isDefaultAttr(spec, v)) continue;
    attrs.push(`${name} = ${printAttr(spec, v)}`);
  }
  const attrText = attrs.length === 0 ? '' : ` {${attrs.join(', ')}}`;
  return `${results} = ${def.name}(${operands})${attrText} : ${types}`;
}

/**
 * Prints a graph in StageML's generic text form (docs/ir.md): one line per node,
 * `%y = sml.op(%a, %b) {attr = value} : f32[batch, 64]`, then `return name = %y, …`.
 * `parseGraph(printGraph(g))` reproduces `g` exactly.
 */
export function printGraph(g: Graph): string {
  const lines = [`graph @${printName(g.name)} {`];
  for (const n of g.nodes) lines.push(`  ${printNode(g, n)}`);
  const outs = g.outputs.map((o) => `${printName(o.name)} = %${printName(g.values[o.value]!.name)}`);
  lines.push(outs.length === 0 ? '  return' : `  return ${outs.join(', ')}`);
  lines.push('}');
  return `${lines.join('\n')}\n`;
}
