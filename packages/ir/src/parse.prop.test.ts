import { fc, test } from '@fast-check/vitest';
import { describe, expect } from 'vitest';

import { arbGraph } from '../../testkit/src/index.js';
import { IrError } from './errors.js';
import { parseGraph, stripSpans } from './parse.js';
import { printGraph } from './print.js';
import { verifyGraph } from './verify.js';

const graphs = arbGraph({ maxNodes: 10 });

/** Tokens of the text form, for splicing into printed graphs. */
const TOKENS = [
  '%',
  '@',
  '{',
  '}',
  '(',
  ')',
  '[',
  ']',
  ',',
  '=',
  ':',
  '"',
  '\n',
  ' ',
  '// c\n',
  'return',
  'graph',
  'input',
  'param',
  'sml.add',
  'sml.matmul',
  'sml.nope',
  'f32',
  'i64',
  'q7',
  'seq',
  '-1',
  '0',
  '1e400',
  'nan',
  '-inf',
  'true',
  '%x0',
  '%out',
  'axis = 0',
  '{k = 1}',
  '"\\u0041"',
  '"\\q"',
];

/** One edit of a text: delete a span, insert a token, duplicate or drop a line, or cut the end. */
const arbEdit = fc.oneof(
  fc.record({ kind: fc.constant('delete' as const), at: fc.nat(), len: fc.integer({ min: 1, max: 8 }) }),
  fc.record({ kind: fc.constant('insert' as const), at: fc.nat(), token: fc.constantFrom(...TOKENS) }),
  fc.record({ kind: fc.constant('insert' as const), at: fc.nat(), token: fc.string({ maxLength: 4 }) }),
  fc.record({ kind: fc.constant('line' as const), at: fc.nat(), dup: fc.boolean() }),
  fc.record({ kind: fc.constant('truncate' as const), at: fc.nat() }),
);
type Edit = typeof arbEdit extends fc.Arbitrary<infer E> ? E : never;

function applyEdit(text: string, e: Edit): string {
  const at = e.at % (text.length + 1);
  switch (e.kind) {
    case 'delete':
      return text.slice(0, at) + text.slice(at + e.len);
    case 'insert':
      return text.slice(0, at) + e.token + text.slice(at);
    case 'truncate':
      return text.slice(0, at);
    case 'line': {
      const lines = text.split('\n');
      const i = e.at % lines.length;
      if (e.dup) lines.splice(i, 0, lines[i]!);
      else lines.splice(i, 1);
      return lines.join('\n');
    }
  }
}

/** Parses `text`; the only acceptable failure is a coded error. Returns the graph or the error. */
function parseOrCode(text: string): unknown {
  try {
    return parseGraph(text);
  } catch (e) {
    expect(e, `parseGraph threw a non-coded ${e instanceof Error ? e.name : typeof e}: ${String(e)}`).toBeInstanceOf(IrError);
    expect((e as IrError).code).toMatch(/^IR_[A-Z_]+$/);
    return e;
  }
}

describe('parseGraph', () => {
  test.prop([graphs])('inverts printGraph exactly (parse ∘ print = id)', (g) => {
    expect(stripSpans(parseGraph(printGraph(g)))).toEqual(g);
  });

  test.prop([graphs])('records a 1-based source line for every node', (g) => {
    const parsed = parseGraph(printGraph(g));
    expect(parsed.spans?.map((s) => s?.line)).toEqual(g.nodes.map((_, i) => i + 2));
  });

  test.prop([graphs, fc.array(arbEdit, { minLength: 1, maxLength: 3 })])(
    'only ever throws coded IrErrors on mutated printed graphs, and what parses verifies',
    (g, edits) => {
      const text = edits.reduce(applyEdit, printGraph(g));
      const r = parseOrCode(text);
      if (!(r instanceof IrError)) verifyGraph(r as ReturnType<typeof parseGraph>);
    },
  );

  test.prop([fc.string({ maxLength: 60 })])('only ever throws coded IrErrors on arbitrary strings', (s) => {
    parseOrCode(s);
    parseOrCode(`graph @g {\n${s}\n}`);
  });
});

describe('printGraph', () => {
  test.prop([graphs])('is idempotent through a parse (print ∘ parse ∘ print = print)', (g) => {
    const text = printGraph(g);
    expect(printGraph(parseGraph(text))).toBe(text);
  });

  test.prop([graphs])('prints one line per node between the header and the return', (g) => {
    const lines = printGraph(g).trimEnd().split('\n');
    expect(lines.length).toBe(g.nodes.length + 3);
    expect(lines[0]).toMatch(/^graph @/);
    expect(lines[lines.length - 2]).toMatch(/^ {2}return/);
    expect(lines[lines.length - 1]).toBe('}');
  });
});
