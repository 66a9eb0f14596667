import { type AttrSpec, type AttrValue, normalizeAttrs } from './attrs.js';
import { type Dim, parseDim } from './dim.js';
import { parseDType } from './dtype.js';
import { IrCode, IrError, type NodeRef, StageError } from './errors.js';
import type { Graph, GraphNode, GraphOutput, SourceSpan, ValueId, ValueInfo } from './graph.js';
import { operandArity } from './op-def.js';
import { opDef, opKeyByName } from './ops/index.js';
import type { TensorType } from './types.js';
import { verifyGraph } from './verify.js';

/** Options of `parseGraph`. */
export interface ParseOptions {
  /** Verify the parsed graph (default true); errors point at source lines. */
  readonly verify?: boolean;
}

const NAME_CHARS = /[A-Za-z0-9_.$\-/:]/;

class Scanner {
  pos = 0;
  #lineStarts: number[] | undefined;
  constructor(readonly src: string) {}

  where(pos = this.pos): SourceSpan {
    if (this.#lineStarts === undefined) {
      this.#lineStarts = [0];
      for (let i = 0; i < this.src.length; i++) if (this.src[i] === '\n') this.#lineStarts.push(i + 1);
    }
    const starts = this.#lineStarts;
    let lo = 0;
    let hi = starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (starts[mid]! <= pos) lo = mid;
      else hi = mid - 1;
    }
    return { line: lo + 1, column: pos - starts[lo]! + 1 };
  }
  fail(msg: string, pos = this.pos, code: IrError['code'] = IrCode.PARSE_ERROR): never {
    const w = this.where(pos);
    throw new IrError(code, msg, { at: { line: w.line, column: w.column } });
  }
  skip(): void {
    for (;;) {
      const c = this.src[this.pos];
      if (c === ' ' || c === '\t' || c === '\n' || c === '\r') this.pos++;
      else if (c === '/' && this.src[this.pos + 1] === '/') {
        while (this.pos < this.src.length && this.src[this.pos] !== '\n') this.pos++;
      } else return;
    }
  }
  peek(): string | undefined {
    this.skip();
    return this.src[this.pos];
  }
  eat(s: string): boolean {
    this.skip();
    if (this.src.startsWith(s, this.pos)) {
      this.pos += s.length;
      return true;
    }
    return false;
  }
  expect(s: string, what = `'${s}'`): void {
    if (!this.eat(s)) this.fail(`expected ${what}, found ${this.describe()}`);
  }
  describe(): string {
    this.skip();
    if (this.pos >= this.src.length) return 'end of input';
    return `'${this.src.slice(this.pos, this.pos + 12).split('\n')[0]!}'`;
  }
  word(): string {
    this.skip();
    const start = this.pos;
    while (this.pos < this.src.length && /[A-Za-z0-9_.]/.test(this.src[this.pos]!)) this.pos++;
    if (start === this.pos) this.fail(`expected a word, found ${this.describe()}`);
    return this.src.slice(start, this.pos);
  }
  name(): string {
    this.skip();
    if (this.src[this.pos] === '"') return this.string();
    const start = this.pos;
    while (this.pos < this.src.length && NAME_CHARS.test(this.src[this.pos]!)) this.pos++;
    if (start === this.pos) this.fail(`expected a name, found ${this.describe()}`);
    return this.src.slice(start, this.pos);
  }
  string(): string {
    this.skip();
    const start = this.pos;
    if (this.src[this.pos] !== '"') this.fail(`expected a string, found ${this.describe()}`);
    this.pos++;
    while (this.pos < this.src.length && this.src[this.pos] !== '"') {
      if (this.src[this.pos] === '\\') this.pos++;
      this.pos++;
    }
    if (this.pos >= this.src.length) this.fail('unterminated string', start);
    this.pos++;
    try {
      return JSON.parse(this.src.slice(start, this.pos)) as string;
    } catch {
      return this.fail('malformed string literal', start);
    }
  }
  /** Raw text up to a top-level `,` or one of `closers`, with balanced parentheses. */
  until(closers: string): string {
    this.skip();
    const start = this.pos;
    let depth = 0;
    while (this.pos < this.src.length) {
      const c = this.src[this.pos]!;
      if (c === '(') depth++;
      else if (c === ')') {
        if (depth === 0) break;
        depth--;
      } else if (depth === 0 && (c === ',' || closers.includes(c) || c === '\n')) break;
      this.pos++;
    }
    return this.src.slice(start, this.pos).trim();
  }
  number(): number {
    this.skip();
    const m = /^(-?inf|nan|-?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)/.exec(this.src.slice(this.pos, this.pos + 64));
    if (m === null) this.fail(`expected a number, found ${this.describe()}`);
    this.pos += m[0].length;
    const t = m[0];
    if (t === 'nan') return Number.NaN;
    if (t === 'inf') return Number.POSITIVE_INFINITY;
    if (t === '-inf') return Number.NEGATIVE_INFINITY;
    return Number(t);
  }
}

function parseDimAt(sc: Scanner, text: string, start: number): Dim {
  if (text === '') sc.fail('expected a dimension', start);
  try {
    return parseDim(text);
  } catch (e) {
    return sc.fail(e instanceof Error ? e.message : 'bad dimension', start, IrCode.INVALID_DIM);
  }
}

function parseTypeAt(sc: Scanner): TensorType {
  sc.skip();
  const start = sc.pos;
  const dt = sc.word();
  let dtype;
  try {
    dtype = parseDType(dt);
  } catch {
    return sc.fail(`unknown dtype '${dt}'`, start, IrCode.UNKNOWN_DTYPE);
  }
  sc.expect('[');
  const shape: Dim[] = [];
  if (!sc.eat(']')) {
    do {
      sc.skip();
      const at = sc.pos;
      shape.push(parseDimAt(sc, sc.until(']'), at));
    } while (sc.eat(','));
    sc.expect(']');
  }
  for (const d of shape) if (typeof d === 'number' && d < 0) sc.fail('negative dimension in a type', start, IrCode.INVALID_DIM);
  return { dtype, shape };
}

function parseList<T>(sc: Scanner, item: () => T): T[] {
  sc.expect('[');
  const out: T[] = [];
  if (sc.eat(']')) return out;
  do out.push(item());
  while (sc.eat(','));
  sc.expect(']');
  return out;
}

function parseAttrValue(sc: Scanner, spec: AttrSpec): AttrValue {
  switch (spec.kind) {
    case 'bool': {
      const w = sc.word();
      if (w !== 'true' && w !== 'false') sc.fail(`expected true or false, got '${w}'`);
      return w === 'true';
    }
    case 'int':
    case 'float':
      return sc.number();
    case 'enum':
      return sc.string();
    case 'ints':
    case 'floats':
      return parseList(sc, () => sc.number());
    case 'dim': {
      sc.skip();
      const at = sc.pos;
      return parseDimAt(sc, sc.until('}'), at);
    }
    case 'dims':
      return parseList(sc, () => {
        sc.skip();
        const at = sc.pos;
        return parseDimAt(sc, sc.until(']'), at);
      });
    case 'dtype':
      return sc.word();
  }
}

/**
 * Parses StageML's text form (see `printGraph`). Syntax errors are `IR_PARSE_ERROR` with
 * line:column; unknown ops, bad attributes and type errors carry their own codes and the
 * position of the offending node.
 */
export function parseGraph(text: string, opts: ParseOptions = {}): Graph {
  const sc: Scanner = new Scanner(text);
  sc.expect('graph', "'graph'");
  sc.expect('@', "'@' and a graph name");
  const name = sc.name();
  sc.expect('{');
  const nodes: GraphNode[] = [];
  const values: ValueInfo[] = [];
  const spans: SourceSpan[] = [];
  const byName = new Map<string, ValueId>();
  let outputs: GraphOutput[] | undefined;
  const ref = (): ValueId => {
    sc.skip();
    const at = sc.pos;
    sc.expect('%', "'%' and a value name");
    const n = sc.name();
    const id = byName.get(n);
    if (id === undefined) sc.fail(`value %${n} is used before it is defined`, at, IrCode.UNDEFINED_VALUE);
    return id;
  };
  while (!sc.eat('}')) {
    if (sc.peek() === undefined) sc.fail("expected '}' closing the graph");
    sc.skip();
    const start = sc.pos;
    const span = sc.where(start);
    const at: NodeRef = { graph: name, node: nodes.length, line: span.line, column: span.column };
    if (sc.eat('return')) {
      if (outputs !== undefined) sc.fail('a graph has one return', start);
      outputs = [];
      if (sc.peek() !== '}') {
        do {
          const oname = sc.name();
          sc.expect('=');
          outputs.push({ name: oname, value: ref() });
        } while (sc.eat(','));
      }
      continue;
    }
    if (outputs !== undefined) sc.fail('nothing may follow return', start);
    const resultNames: string[] = [];
    do {
      sc.expect('%', "'%' and a result name");
      const rn = sc.name();
      if (byName.has(rn) || resultNames.includes(rn)) sc.fail(`value %${rn} is defined twice`, start, IrCode.DUPLICATE_NAME);
      resultNames.push(rn);
    } while (sc.eat(','));
    sc.expect('=');
    sc.skip();
    const opStart = sc.pos;
    const head = sc.word();
    let node: GraphNode;
    if (head === 'input' || head === 'param') {
      if (resultNames.length !== 1) sc.fail(`${head} defines exactly one value`, start);
      node = { kind: head, name: resultNames[0]!, operands: [], results: [values.length] };
    } else {
      let key;
      try {
        key = opKeyByName(head);
      } catch {
        return sc.fail(`unknown op '${head}'`, opStart, IrCode.UNKNOWN_OP);
      }
      const def = opDef(key);
      sc.expect('(');
      const operands: ValueId[] = [];
      if (!sc.eat(')')) {
        do operands.push(ref());
        while (sc.eat(','));
        sc.expect(')');
      }
      const arity = operandArity(def.operands);
      if (operands.length < arity.min || operands.length > arity.max) {
        sc.fail(`${def.name} takes ${def.operands.join(', ') || 'no operands'}, got ${String(operands.length)} operands`, opStart, IrCode.OPERAND_COUNT);
      }
      const raw: Record<string, AttrValue> = {};
      if (sc.eat('{')) {
        if (!sc.eat('}')) {
          do {
            sc.skip();
            const attrAt = sc.pos;
            const an = sc.word();
            const spec = def.attrs[an];
            if (spec === undefined) sc.fail(`${def.name} has no attribute '${an}'`, attrAt, IrCode.BAD_ATTR);
            if (Object.hasOwn(raw, an)) sc.fail(`attribute '${an}' given twice`, attrAt, IrCode.BAD_ATTR);
            sc.expect('=');
            raw[an] = parseAttrValue(sc, spec);
          } while (sc.eat(','));
          sc.expect('}');
        }
      }
      let attrs: Record<string, AttrValue>;
      try {
        attrs = normalizeAttrs(def.name, def.attrs, raw, at);
      } catch (e) {
        throw e instanceof StageError ? e : new IrError(IrCode.BAD_ATTR, 'bad attributes', { at, cause: e });
      }
      if (resultNames.length !== def.results) {
        sc.fail(`${def.name} defines ${String(def.results)} value(s), ${String(resultNames.length)} named`, start, IrCode.MALFORMED_GRAPH);
      }
      node = { kind: 'op', op: key, operands, attrs, results: resultNames.map((_, k) => values.length + k) };
    }
    sc.expect(':', "':' and the result type");
    const types: TensorType[] = [];
    do types.push(parseTypeAt(sc));
    while (sc.eat(','));
    if (types.length !== resultNames.length) sc.fail(`${String(resultNames.length)} results but ${String(types.length)} types`, start);
    resultNames.forEach((rn, k) => {
      byName.set(rn, values.length);
      values.push({ name: rn, type: types[k]!, node: nodes.length, index: k });
    });
    nodes.push(node);
    spans.push(span);
  }
  if (sc.peek() !== undefined) sc.fail('unexpected text after the graph');
  const g: Graph = { name, nodes, values, outputs: outputs ?? [], spans };
  if (opts.verify !== false) verifyGraph(g);
  return g;
}

/** Drops source positions, giving a graph structurally comparable with a built one. */
export function stripSpans(g: Graph): Graph {
  return { name: g.name, nodes: g.nodes, values: g.values, outputs: g.outputs };
}
