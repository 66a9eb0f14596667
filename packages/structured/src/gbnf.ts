import { StructuredCode, StructuredError } from './errors.js';
import { type Expr, type Grammar, EMPTY, alt, lit, ref, rep, seq } from './grammar.js';
import { compileRegexBody } from './regex.js';

const bad = (what: string): never => {
  throw new StructuredError(StructuredCode.BAD_GRAMMAR, what);
};

type Tok =
  | { readonly t: 'name'; readonly v: string; readonly def: boolean }
  | { readonly t: 'str'; readonly v: string }
  | { readonly t: 'class'; readonly v: string }
  | { readonly t: 'op'; readonly v: string };

function unescape(body: string, line: number): string {
  return body.replace(/\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|.)/gs, (_, e: string) => {
    if (e.length > 1) return String.fromCharCode(parseInt(e.slice(1), 16));
    const m: Record<string, string> = { n: '\n', t: '\t', r: '\r', '"': '"', '\\': '\\', ']': ']', '[': '[', '-': '-' };
    return m[e] ?? bad(`line ${String(line)}: unknown escape \\${e}`);
  });
}

function tokenize(src: string): Tok[] {
  const out: Tok[] = [];
  const re = /\s+|#[^\n]*|([A-Za-z_][A-Za-z0-9_-]*)(\s*::=)?|"((?:[^"\\]|\\.)*)"|\[((?:[^\]\\]|\\.)*)\]|(::=|[()|*+?]|\{\s*\d+\s*(?:,\s*\d*\s*)?\})/gsy;
  let m: RegExpExecArray | null;
  let at = 0;
  while (at < src.length) {
    re.lastIndex = at;
    m = re.exec(src);
    const line = src.slice(0, at).split('\n').length;
    if (m === null) bad(`line ${String(line)}: unexpected ${JSON.stringify(src.slice(at, at + 10))}`);
    at = re.lastIndex;
    if (m![1] !== undefined) out.push({ t: 'name', v: m![1], def: m![2] !== undefined });
    else if (m![3] !== undefined) out.push({ t: 'str', v: unescape(m![3], line) });
    else if (m![4] !== undefined) out.push({ t: 'class', v: m![4] });
    else if (m![5] !== undefined) out.push({ t: 'op', v: m![5].replace(/\s+/g, '') });
  }
  return out;
}

/**
 * Parses a GBNF grammar (llama.cpp's EBNF dialect, which xgrammar's EBNF also reads): rules
 * `name ::= alternatives`, string literals `"…"` (escapes `\n \t \r \" \\ \xNN \uNNNN`), character
 * classes `[a-z]` / `[^…]` (ASCII ranges), groups, `|`, `* + ?`, `{m}`, `{m,}`, `{m,n}`, `#`
 * comments. The start rule is `root`. Errors (syntax, an undefined rule, left recursion at
 * compile time) are `STRUCT_BAD_GRAMMAR`.
 */
export function gbnfGrammar(src: string): Grammar {
  const toks = tokenize(src);
  const rules = new Map<string, Expr>();
  let i = 0;
  const parseAlt = (): Expr => {
    const items = [parseSeq()];
    while (toks[i]?.t === 'op' && toks[i]!.v === '|') {
      i++;
      items.push(parseSeq());
    }
    return alt(...items);
  };
  const parseAtom = (): Expr => {
    const t = toks[i++]!;
    if (t.t === 'str') return lit(t.v);
    if (t.t === 'class') return compileRegexBody(`[${t.v}]`);
    if (t.t === 'name') return ref(t.v);
    if (t.v === '(') {
      const e = parseAlt();
      if (toks[i]?.t !== 'op' || toks[i]!.v !== ')') bad(`unbalanced parenthesis in rule near token ${String(i)}`);
      i++;
      return e;
    }
    return bad(`unexpected '${t.v}'`);
  };
  function parseSeq(): Expr {
    const items: Expr[] = [];
    for (;;) {
      const t = toks[i];
      if (t === undefined || (t.t === 'name' && t.def) || (t.t === 'op' && (t.v === '|' || t.v === ')'))) break;
      let e = parseAtom();
      for (;;) {
        const q = toks[i];
        if (q?.t !== 'op') break;
        if (q.v === '*') e = rep(e, 0, Infinity);
        else if (q.v === '+') e = rep(e, 1, Infinity);
        else if (q.v === '?') e = rep(e, 0, 1);
        else if (q.v.startsWith('{')) {
          const [a, b] = q.v.slice(1, -1).split(',');
          e = rep(e, Number(a), b === undefined ? Number(a) : b === '' ? Infinity : Number(b));
        } else break;
        i++;
      }
      items.push(e);
    }
    return items.length === 0 ? EMPTY : seq(...items);
  }
  while (i < toks.length) {
    const t = toks[i++]!;
    if (t.t !== 'name' || !t.def) bad(`expected 'name ::=' at the start of a rule, got ${JSON.stringify(t.v)}`);
    if (rules.has(t.v)) bad(`rule '${t.v}' is defined twice`);
    rules.set(t.v, parseAlt());
  }
  if (!rules.has('root')) bad("the grammar has no 'root' rule");
  return { rules, root: 'root' };
}
