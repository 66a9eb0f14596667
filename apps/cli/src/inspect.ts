import { readFileSync } from 'node:fs';
import {
  type Graph,
  type Dim,
  deserializeGraph,
  dimAdd,
  dimProduct,
  dimSymbols,
  dimToString,
  evalCost,
  graphCost,
  graphInputs,
  graphParams,
  graphStats,
  parseGraph,
  typeBytes,
  typeToString,
  verifyGraph,
  errorMessage,
} from '@stageml/ir';
import { CliCode, CliError } from './errors.js';

/** Reads a graph from `.ir` text or `.json`, verifying it. */
export function loadGraphFile(path: string): Graph {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot read '${path}': ${errorMessage(e)}`, { cause: e });
  }
  const g = path.endsWith('.json') || text.trimStart().startsWith('{') ? deserializeGraph(text) : parseGraph(text);
  verifyGraph(g);
  return g;
}

/** Machine-readable summary of a graph. */
export interface GraphSummary {
  readonly name: string;
  readonly inputs: { name: string; type: string }[];
  readonly params: { count: number; bytes: string };
  readonly ops: number;
  readonly byOp: Record<string, number>;
  readonly outputs: { name: string; type: string }[];
  readonly flops: string;
  readonly bytes: string;
  readonly flopsAt1x1: number;
}

/** Summarizes a verified graph: signature, op counts and symbolic cost. */
export function summarizeGraph(g: Graph): GraphSummary {
  const stats = graphStats(g);
  const cost = graphCost(g);
  const params = graphParams(g);
  const paramBytes = dimToString(dimProduct([1, params.reduce<Dim>((a, p) => dimAdd(a, typeBytes(g.values[p.results[0]!]!.type)), 0)]));
  const symbols: Record<string, number> = {};
  for (const v of g.values) for (const d of v.type.shape) for (const name of dimSymbols(d)) symbols[name] = 1;
  return {
    name: g.name,
    inputs: graphInputs(g).map((n) => ({ name: n.name, type: typeToString(g.values[n.results[0]!]!.type) })),
    params: { count: params.length, bytes: paramBytes },
    ops: stats.ops,
    byOp: stats.byOp,
    outputs: g.outputs.map((o) => ({ name: o.name, type: typeToString(g.values[o.value]!.type) })),
    flops: dimToString(cost.flops),
    bytes: dimToString(cost.bytes),
    flopsAt1x1: evalCost(cost, symbols).flops,
  };
}

/** Human-readable rendering of a summary. */
export function formatSummary(s: GraphSummary): string {
  const lines = [
    `graph @${s.name}: verified`,
    `  inputs:  ${s.inputs.map((i) => `${i.name}: ${i.type}`).join(', ') || '(none)'}`,
    `  params:  ${String(s.params.count)} (${s.params.bytes} bytes)`,
    `  outputs: ${s.outputs.map((o) => `${o.name}: ${o.type}`).join(', ') || '(none)'}`,
    `  ops:     ${String(s.ops)}`,
  ];
  const width = Math.max(0, ...Object.keys(s.byOp).map((k) => k.length));
  for (const [op, n] of Object.entries(s.byOp).sort((a, b) => b[1] - a[1])) lines.push(`    ${op.padEnd(width)}  ${String(n)}`);
  lines.push(`  FLOPs:   ${s.flops}`, `  bytes:   ${s.bytes}`, `  FLOPs with every symbol = 1: ${String(s.flopsAt1x1)}`);
  return lines.join('\n');
}
