import { IrCode, IrError } from './errors.js';

/** One monomial `coef · v1 · v2 · …` of a symbolic dimension; `vars` is sorted and may repeat. */
export interface DimTerm {
  /** Symbol names of the monomial, sorted; repetition means a power. */
  readonly vars: readonly string[];
  /** Integer coefficient, never zero. */
  readonly coef: number;
}

/**
 * A symbolic dimension: an integer polynomial over named sizes (`batch`, `seq`, …) in canonical
 * form, with at least one non-constant term. Constant dims are plain numbers, so two equal dims are
 * always structurally equal (compare with `dimEquals`).
 */
export interface SymDim {
  /** Non-constant terms, in canonical order. */
  readonly terms: readonly DimTerm[];
  /** The constant term. */
  readonly constant: number;
}

/** A dimension: a non-negative integer, or a symbolic polynomial over named sizes. */
export type Dim = number | SymDim;

/** Sizes bound to symbol names (e.g. `{ batch: 4, seq: 17 }`). */
export type DimBindings = Readonly<Record<string, number>>;

const SYMBOL_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Whether `name` is a valid symbol name. */
export function isSymbolName(name: string): boolean {
  return SYMBOL_RE.test(name);
}

/** A symbolic dimension of one named size. */
export function sym(name: string): SymDim {
  if (!isSymbolName(name)) {
    throw new IrError(IrCode.INVALID_DIM, `'${name}' is not a valid dimension symbol (letters, digits, _)`);
  }
  return { terms: [{ vars: [name], coef: 1 }], constant: 0 };
}

/** Whether `d` is a known integer. */
export function isStaticDim(d: Dim): d is number {
  return typeof d === 'number';
}

function monoKey(vars: readonly string[]): string {
  return vars.join('*');
}

function compareTerms(a: DimTerm, b: DimTerm): number {
  if (a.vars.length !== b.vars.length) return b.vars.length - a.vars.length;
  const ka = monoKey(a.vars);
  const kb = monoKey(b.vars);
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

// NOTE: integer arithmetic can yield −0 (0 · −1, 0 / −2), which is a different value to
// structural comparison (Object.is, toEqual) and prints as 0; canonical dims never hold it.
function noNegZero(x: number): number {
  return x === 0 ? 0 : x;
}

function normalize(terms: Iterable<DimTerm>, constant: number): Dim {
  const acc = new Map<string, DimTerm>();
  for (const t of terms) {
    const key = monoKey(t.vars);
    const prev = acc.get(key);
    acc.set(key, { vars: t.vars, coef: (prev?.coef ?? 0) + t.coef });
  }
  const out = [...acc.values()].filter((t) => t.coef !== 0).sort(compareTerms);
  if (out.length === 0) return noNegZero(constant);
  return { terms: out, constant: noNegZero(constant) };
}

function asPoly(d: Dim): SymDim {
  return typeof d === 'number' ? { terms: [], constant: d } : d;
}

/** a + b. */
export function dimAdd(a: Dim, b: Dim): Dim {
  if (typeof a === 'number' && typeof b === 'number') return a + b;
  const pa = asPoly(a);
  const pb = asPoly(b);
  return normalize([...pa.terms, ...pb.terms], pa.constant + pb.constant);
}

/** a − b. */
export function dimSub(a: Dim, b: Dim): Dim {
  return dimAdd(a, dimMul(b, -1));
}

function scale(p: SymDim, k: number): Dim {
  if (k === 0) return 0;
  if (k === 1) return p;
  // Scaling by a non-zero integer keeps the canonical order and never cancels a term.
  return { terms: p.terms.map((t) => ({ vars: t.vars, coef: t.coef * k })), constant: noNegZero(p.constant * k) };
}

/** a · b. */
export function dimMul(a: Dim, b: Dim): Dim {
  if (typeof a === 'number' && typeof b === 'number') return noNegZero(a * b);
  if (typeof a === 'number') return scale(b as SymDim, a);
  if (typeof b === 'number') return scale(a, b);
  const pa = asPoly(a);
  const pb = asPoly(b);
  const terms: DimTerm[] = [];
  const lhs = [...pa.terms, { vars: [], coef: pa.constant }];
  const rhs = [...pb.terms, { vars: [], coef: pb.constant }];
  let constant = 0;
  for (const x of lhs) {
    for (const y of rhs) {
      const coef = x.coef * y.coef;
      if (coef === 0) continue;
      const vars = [...x.vars, ...y.vars].sort();
      if (vars.length === 0) constant += coef;
      else terms.push({ vars, coef });
    }
  }
  return normalize(terms, constant);
}

/** The sum of `dims` (0 for none), normalized once: cheaper than folding `dimAdd`. */
export function dimSum(dims: Iterable<Dim>): Dim {
  let constant = 0;
  const terms: DimTerm[] = [];
  let symbolic = false;
  for (const d of dims) {
    if (typeof d === 'number') constant += d;
    else {
      symbolic = true;
      constant += d.constant;
      terms.push(...d.terms);
    }
  }
  return symbolic ? normalize(terms, constant) : constant;
}

/** The product of `dims` (1 for none). */
export function dimProduct(dims: readonly Dim[]): Dim {
  let k = 1;
  let acc: Dim | undefined;
  for (const d of dims) {
    if (typeof d === 'number') k *= d;
    else acc = acc === undefined ? d : dimMul(acc, d);
  }
  return acc === undefined ? noNegZero(k) : dimMul(acc, k);
}

/** Structural equality of dims (sound because both sides are canonical). */
export function dimEquals(a: Dim, b: Dim): boolean {
  if (typeof a === 'number' || typeof b === 'number') return a === b;
  return dimToString(a) === dimToString(b);
}

function removeVars(from: readonly string[], vars: readonly string[]): string[] | undefined {
  const rest = [...from];
  for (const v of vars) {
    const i = rest.indexOf(v);
    if (i < 0) return undefined;
    rest.splice(i, 1);
  }
  return rest;
}

/**
 * Exact division a / b, or `undefined` when the quotient is not an integer polynomial. Divisors
 * may be integers or single monomials (`batch*seq`, `4*seq`); a general polynomial divides only a
 * multiple of itself.
 */
export function dimDivExact(a: Dim, b: Dim): Dim | undefined {
  if (typeof b === 'number') {
    if (b === 0) return undefined;
    if (typeof a === 'number') return a % b === 0 ? noNegZero(a / b) : undefined;
    if (a.constant % b !== 0 || a.terms.some((t) => t.coef % b !== 0)) return undefined;
    return normalize(
      a.terms.map((t) => ({ vars: t.vars, coef: t.coef / b })),
      a.constant / b,
    );
  }
  if (b.terms.length === 1 && b.constant === 0) {
    const [mono] = b.terms as [DimTerm];
    const pa = asPoly(a);
    if (pa.constant !== 0) return undefined;
    const terms: DimTerm[] = [];
    let constant = 0;
    for (const t of pa.terms) {
      const vars = removeVars(t.vars, mono.vars);
      if (vars === undefined || t.coef % mono.coef !== 0) return undefined;
      if (vars.length === 0) constant += t.coef / mono.coef;
      else terms.push({ vars, coef: t.coef / mono.coef });
    }
    return normalize(terms, constant);
  }
  for (let k = 1; k <= 64; k++) if (dimEquals(a, dimMul(b, k))) return k;
  return undefined;
}

/** Symbol names a dim mentions, sorted and unique. */
export function dimSymbols(d: Dim): string[] {
  if (typeof d === 'number') return [];
  return [...new Set(d.terms.flatMap((t) => t.vars))].sort();
}

/** Evaluates a dim under bindings; throws `IR_EVAL_ERROR` naming a missing symbol. */
export function evalDim(d: Dim, bindings: DimBindings): number {
  if (typeof d === 'number') return d;
  let acc = d.constant;
  for (const t of d.terms) {
    let v = t.coef;
    for (const name of t.vars) {
      const x = bindings[name];
      if (x === undefined) {
        throw new IrError(IrCode.EVAL_ERROR, `dimension symbol '${name}' has no binding`, {
          hint: 'bind it through an input whose declared shape mentions it',
        });
      }
      v *= x;
    }
    acc += v;
  }
  return acc;
}

/**
 * Partially evaluates a dim: symbols with a binding are replaced by their values, the others stay
 * symbolic (`substituteDim(batch*seq + 1, { batch: 2 })` is `2*seq + 1`).
 */
export function substituteDim(d: Dim, bindings: DimBindings): Dim {
  if (typeof d === 'number' || d.terms.every((t) => t.vars.every((v) => bindings[v] === undefined))) return d;
  let acc: Dim = d.constant;
  for (const t of d.terms) {
    let term: Dim = t.coef;
    for (const name of t.vars) {
      const x = bindings[name];
      term = dimMul(term, x ?? sym(name));
    }
    acc = dimAdd(acc, term);
  }
  return acc;
}

function monoToString(t: DimTerm, first: boolean): string {
  const parts: string[] = [];
  const mag = Math.abs(t.coef);
  if (mag !== 1) parts.push(String(mag));
  parts.push(...t.vars);
  const body = parts.join('*');
  if (first) return t.coef < 0 ? `-${body}` : body;
  return t.coef < 0 ? ` - ${body}` : ` + ${body}`;
}

/** Canonical text of a dim: `4096`, `seq`, `batch*seq`, `seq + 1`, `2*kv - 3`. */
export function dimToString(d: Dim): string {
  if (typeof d === 'number') return String(d);
  let s = '';
  d.terms.forEach((t, i) => {
    s += monoToString(t, i === 0);
  });
  if (d.constant > 0) s += ` + ${String(d.constant)}`;
  else if (d.constant < 0) s += ` - ${String(-d.constant)}`;
  return s;
}

/**
 * Checks that `d` is a usable dimension: a non-negative safe integer, or a symbolic polynomial
 * whose coefficients are safe integers. Throws `IR_INVALID_DIM` otherwise.
 */
export function checkDim(d: unknown, what = 'dimension'): Dim {
  if (typeof d === 'number') {
    if (!Number.isSafeInteger(d) || d < 0) {
      throw new IrError(IrCode.INVALID_DIM, `${what} must be a non-negative integer, got ${String(d)}`);
    }
    return d;
  }
  if (typeof d !== 'object' || d === null) {
    throw new IrError(IrCode.INVALID_DIM, `${what} must be an integer or a symbolic dim`);
  }
  const { terms, constant } = d as Partial<SymDim>;
  if (!Array.isArray(terms) || typeof constant !== 'number' || !Number.isSafeInteger(constant)) {
    throw new IrError(IrCode.INVALID_DIM, `${what} is not a well-formed symbolic dim`);
  }
  const clean: DimTerm[] = [];
  for (const t of terms as unknown[]) {
    const { vars, coef } = (t ?? {}) as Partial<DimTerm>;
    if (
      !Array.isArray(vars) ||
      vars.length === 0 ||
      !vars.every((v) => typeof v === 'string' && isSymbolName(v)) ||
      typeof coef !== 'number' ||
      !Number.isSafeInteger(coef)
    ) {
      throw new IrError(IrCode.INVALID_DIM, `${what} has a malformed term`);
    }
    clean.push({ vars: [...(vars as string[])].sort(), coef });
  }
  return normalize(clean, constant);
}

/** Parses a dim expression (`4096`, `seq`, `batch*seq`, `seq + 1`, `(a + 1)*2`, `4*seq/2`; division must be exact). */
export function parseDim(text: string): Dim {
  const p = new DimParser(text);
  const d = p.parseExpr();
  p.expectEnd();
  return d;
}

class DimParser {
  private pos = 0;
  // NOTE: nesting is bounded so hostile input fails with IR_INVALID_DIM, not a stack overflow.
  private depth = 0;
  constructor(private readonly src: string) {}

  private fail(msg: string): never {
    throw new IrError(IrCode.INVALID_DIM, `bad dimension '${this.src}': ${msg} at offset ${String(this.pos)}`);
  }
  private skip(): void {
    while (this.pos < this.src.length && /\s/.test(this.src[this.pos]!)) this.pos++;
  }
  private peek(): string | undefined {
    this.skip();
    return this.src[this.pos];
  }
  private enter(): void {
    if (++this.depth > 256) this.fail('expression nested too deeply');
  }
  expectEnd(): void {
    if (this.peek() !== undefined) this.fail('unexpected text');
  }
  parseExpr(): Dim {
    let acc = this.parseTerm();
    for (;;) {
      const c = this.peek();
      if (c === '+') {
        this.pos++;
        acc = dimAdd(acc, this.parseTerm());
      } else if (c === '-') {
        this.pos++;
        acc = dimSub(acc, this.parseTerm());
      } else return acc;
    }
  }
  private parseTerm(): Dim {
    let acc = this.parseAtom();
    for (;;) {
      const c = this.peek();
      if (c === '*') {
        this.pos++;
        acc = dimMul(acc, this.parseAtom());
      } else if (c === '/') {
        this.pos++;
        const rhs = this.parseAtom();
        const q = dimDivExact(acc, rhs);
        if (q === undefined) this.fail(`${dimToString(acc)} is not divisible by ${dimToString(rhs)}`);
        acc = q;
      } else return acc;
    }
  }
  private parseAtom(): Dim {
    const c = this.peek();
    if (c === undefined) return this.fail('unexpected end');
    if (c === '(') {
      this.pos++;
      this.enter();
      const d = this.parseExpr();
      this.depth--;
      if (this.peek() !== ')') this.fail("expected ')'");
      this.pos++;
      return d;
    }
    if (c === '-') {
      this.pos++;
      this.enter();
      const d = dimMul(this.parseAtom(), -1);
      this.depth--;
      return d;
    }
    const m = /^(\d+|[A-Za-z_][A-Za-z0-9_]*)/.exec(this.src.slice(this.pos));
    if (m === null) return this.fail(`unexpected '${c}'`);
    this.pos += m[0].length;
    if (/^\d/.test(m[0])) {
      const n = Number(m[0]);
      if (!Number.isSafeInteger(n)) this.fail('integer too large');
      return n;
    }
    return sym(m[0]);
  }
}

/** The symbol a dim is when it is exactly one symbol (`batch`, not `2·batch` or `batch + 1`), else undefined. */
export function dimAsSymbol(d: Dim): string | undefined {
  if (typeof d === 'number' || d.constant !== 0 || d.terms.length !== 1) return undefined;
  const t = d.terms[0]!;
  return t.coef === 1 && t.vars.length === 1 ? t.vars[0] : undefined;
}
