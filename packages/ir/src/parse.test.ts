import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { describe, expect, test } from 'vitest';

import { expectCode } from '../../testkit/src/index.js';
import { traceGraph } from './builder.js';
import { IrCode } from './errors.js';
import { parseGraph, stripSpans } from './parse.js';
import { printGraph } from './print.js';

const INVALID_DIR = fileURLToPath(new URL('../test/invalid/', import.meta.url));

/** One diagnostics case of a `test/invalid/*.sml` file. */
interface InvalidCase {
  readonly file: string;
  /** 1-based line of the case's `// expect:` comment. */
  readonly line: number;
  readonly code: string;
  readonly at: { line: number; column: number } | undefined;
  /** The case's text, preceded by blank lines so positions are those of the file. */
  readonly text: string;
}

/**
 * Splits every `test/invalid/*.sml` file into cases at `// -----` lines (xDSL's
 * `--split-input-file`). Each case carries `// expect: IR_CODE [line:column]`.
 */
function loadInvalidCases(): InvalidCase[] {
  const cases: InvalidCase[] = [];
  for (const file of readdirSync(INVALID_DIR).filter((f) => f.endsWith('.sml')).sort()) {
    const lines = readFileSync(`${INVALID_DIR}${file}`, 'utf8').split('\n');
    const cuts = [-1, ...lines.flatMap((l, i) => (l.trim() === '// -----' ? [i] : [])), lines.length];
    for (let k = 0; k + 1 < cuts.length; k++) {
      const start = cuts[k]! + 1;
      const chunk = lines.slice(start, cuts[k + 1]);
      const expects = chunk.flatMap((l, i) => {
        const m = /^\/\/ expect: (IR_[A-Z_]+)(?: (\d+):(\d+))?\s*$/.exec(l);
        return m === null ? [] : [{ i, code: m[1]!, at: m[2] === undefined ? undefined : { line: Number(m[2]), column: Number(m[3]) } }];
      });
      if (expects.length !== 1) throw new Error(`${file}:${String(start + 1)}: a case needs exactly one '// expect: IR_CODE' line`);
      const [e] = expects as [(typeof expects)[number]];
      cases.push({ file, line: start + e.i + 1, code: e.code, at: e.at, text: '\n'.repeat(start) + chunk.join('\n') });
    }
  }
  return cases;
}

const invalidCases = loadInvalidCases();

describe('parseGraph', () => {
  describe('diagnostics for test/invalid/*.sml', () => {
    test('has cases for every diagnostic family', () => {
      const codes = new Set(invalidCases.map((c) => c.code));
      for (const code of [
        IrCode.PARSE_ERROR,
        IrCode.UNKNOWN_OP,
        IrCode.UNKNOWN_DTYPE,
        IrCode.INVALID_DIM,
        IrCode.BAD_ATTR,
        IrCode.OPERAND_COUNT,
        IrCode.UNDEFINED_VALUE,
        IrCode.DUPLICATE_NAME,
        IrCode.TYPE_MISMATCH,
        IrCode.SHAPE_MISMATCH,
        IrCode.DTYPE_MISMATCH,
      ]) {
        expect(codes).toContain(code);
      }
    });

    test.each(invalidCases.map((c) => [`${c.file}:${String(c.line)}`, c] as const))('%s fails with its expected code and position', (_where, c) => {
      const e = expectCode(() => parseGraph(c.text), c.code);
      if (c.code === IrCode.PARSE_ERROR) expect(e.at?.line, 'syntax errors carry a line').toBeTypeOf('number');
      if (c.at !== undefined) expect({ line: e.at?.line, column: e.at?.column }).toEqual(c.at);
    });
  });

  test('accepts comments, blank lines and free spacing', () => {
    const text = [
      '// leading comment',
      'graph   @g{',
      '',
      '  %x=input:f32[ batch ,2 ]   // trailing comment',
      '  %y = sml.softmax( %x ){ axis=0 } : f32[batch, 2]',
      '  return out=%y',
      '}',
      '',
    ].join('\n');
    const g = parseGraph(text);
    expect(g.nodes.map((n) => n.kind)).toEqual(['input', 'op']);
    expect(g.spans).toEqual([
      { line: 4, column: 3 },
      { line: 5, column: 3 },
    ]);
  });

  test('parses a graph without a return as one with no outputs', () => {
    expect(parseGraph('graph @g {\n  %x = input : f32[]\n}').outputs).toEqual([]);
  });

  test('fills defaults of omitted attributes, as the builder does', () => {
    const built = traceGraph('g', (b) => b.softmax(b.input('x', ['f32', [3]])));
    const parsed = parseGraph('graph @g {\n  %x = input : f32[3]\n  %softmax = sml.softmax(%x) : f32[3]\n  return out = %softmax\n}');
    expect(stripSpans(parsed)).toEqual(built);
  });

  test('skips verification with { verify: false }, still rejecting syntax', () => {
    const text = 'graph @g {\n  %x = input : f32[2]\n  %y = sml.neg(%x) : f32[3]\n  return y = %y\n}';
    expectCode(() => parseGraph(text), IrCode.TYPE_MISMATCH);
    expect(parseGraph(text, { verify: false }).values[1]!.type.shape).toEqual([3]);
    expectCode(() => parseGraph('graph @g {', { verify: false }), IrCode.PARSE_ERROR);
  });

  test('reads quoted graph, value and output names', () => {
    const g = parseGraph('graph @"my graph" {\n  %"x" = input : f32[]\n  return "out put" = %x\n}');
    expect(g.name).toBe('my graph');
    expect(g.values[0]!.name).toBe('x');
    expect(g.outputs[0]!.name).toBe('out put');
  });

  test('round-trips a small hand-written graph to the same text', () => {
    const text = [
      'graph @attn {',
      '  %q = input : f16[batch, 8, seq, 64]',
      '  %k = param : f16[batch, 2, seq, 64]',
      '  %v = param : f16[batch, 2, seq, 64]',
      '  %o = sml.attention(%q, %k, %v) {causal = true, scale = 0.125} : f16[batch, 8, seq, 64]',
      '  %h = sml.reshape(%o) {shape = [batch, -1]} : f16[batch, 512*seq]',
      '  return out = %h',
      '}',
      '',
    ].join('\n');
    expect(printGraph(parseGraph(text))).toBe(text);
  });
});

describe('stripSpans', () => {
  test('drops source positions and keeps everything else', () => {
    const g = parseGraph('graph @g {\n  %x = input : f32[]\n  return out = %x\n}');
    expect(g.spans).toBeDefined();
    const s = stripSpans(g);
    expect(s).not.toHaveProperty('spans');
    expect(s).toEqual({ name: g.name, nodes: g.nodes, values: g.values, outputs: g.outputs });
  });
});
