import { StructuredCode, StructuredError } from './errors.js';
import { type Expr, type Grammar, EMPTY, UTF8_MULTI, alt, byteSet, bytes, lit, rep, seq } from './grammar.js';

/** Options of `compileRegexBody`. */
export interface RegexOptions {
  /**
   * The text is the inside of a JSON string: `"` and `\` are produced escaped, control characters
   * are never produced (default false).
   */
  readonly jsonString?: boolean;
}

const bad = (pattern: string, at: number, what: string): never => {
  throw new StructuredError(StructuredCode.BAD_REGEX, `regex ${JSON.stringify(pattern)} at ${String(at)}: ${what}`);
};

/** An ASCII set plus whether it includes every non-ASCII character. */
interface CharSet {
  readonly ascii: Uint8Array;
  readonly multi: boolean;
}

const setOf = (...parts: (number | [number, number])[]): Uint8Array => byteSet(...parts);
const DIGITS = setOf([0x30, 0x39]);
const WORD = setOf([0x30, 0x39], [0x41, 0x5a], [0x61, 0x7a], 0x5f);
const SPACE = setOf(0x20, 0x09, 0x0a, 0x0b, 0x0c, 0x0d);
const invert = (s: Uint8Array): Uint8Array => {
  const o = new Uint8Array(256);
  for (let i = 0; i < 128; i++) o[i] = s[i] === 1 ? 0 : 1;
  return o;
};

/**
 * Compiles a regular expression (the subset: literals, `.`, classes `[...]` / `[^...]` with
 * ASCII ranges, `\d \w \s \D \W \S`, escapes `\n \t \r \f \v \uXXXX` and escaped punctuation,
 * groups `(...)` / `(?:...)`, `|`, quantifiers `* + ? {n} {n,} {n,m}` (lazy forms match the same
 * language), anchors `^`/`$` at the ends) to the grammar of the strings it fully matches.
 * Backreferences, lookaround and non-ASCII class ranges are `STRUCT_BAD_REGEX`.
 */
export function compileRegexBody(pattern: string, opts: RegexOptions = {}): Expr {
  const json = opts.jsonString ?? false;
  let i = 0;
  const cps = Array.from(pattern);
  const peek = () => cps[i];
  /** One character as grammar: in a JSON string `"`/`\` escaped, controls impossible. */
  const charExpr = (c: string): Expr => {
    const code = c.codePointAt(0)!;
    if (!json) return lit(c);
    if (c === '"' || c === '\\') return lit(`\\${c}`);
    if (code < 0x20) return lit(JSON.stringify(c).slice(1, -1));
    return lit(c);
  };
  const setExpr = (s: CharSet): Expr => {
    const ascii = s.ascii.slice();
    const parts: Expr[] = [];
    if (json) {
      for (let b = 0; b < 0x20; b++) ascii[b] = 0;
      if (ascii[0x22] === 1) parts.push(lit('\\"'));
      if (ascii[0x5c] === 1) parts.push(lit('\\\\'));
      ascii[0x22] = 0;
      ascii[0x5c] = 0;
    }
    if (ascii.some((x) => x === 1)) parts.push(bytes(ascii));
    if (s.multi) parts.push(UTF8_MULTI);
    if (parts.length === 0) return bytes(new Uint8Array(256));
    return alt(...parts);
  };
  const escapeSet = (c: string): CharSet | undefined => {
    switch (c) {
      case 'd': return { ascii: DIGITS, multi: false };
      case 'w': return { ascii: WORD, multi: false };
      case 's': return { ascii: SPACE, multi: false };
      case 'D': return { ascii: invert(DIGITS), multi: true };
      case 'W': return { ascii: invert(WORD), multi: true };
      case 'S': return { ascii: invert(SPACE), multi: true };
      default: return undefined;
    }
  };
  const escapeChar = (c: string): string => {
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return '\0';
      case 'u': {
        const hex = cps.slice(i, i + 4).join('');
        if (!/^[0-9a-fA-F]{4}$/.test(hex)) bad(pattern, i, '\\u needs four hex digits');
        i += 4;
        return String.fromCharCode(parseInt(hex, 16));
      }
      default:
        if (/[0-9]/.test(c)) bad(pattern, i, 'backreferences are not supported');
        if (/[a-zA-Z]/.test(c)) bad(pattern, i, `escape \\${c} is not supported`);
        return c;
    }
  };
  const parseClass = (): CharSet => {
    const negate = peek() === '^';
    if (negate) i++;
    const ascii = new Uint8Array(256);
    let multiChars = false;
    let first = true;
    while (i < cps.length && (peek() !== ']' || first)) {
      first = false;
      let c = cps[i++]!;
      if (c === '\\') {
        const e = cps[i++] ?? bad(pattern, i, 'dangling escape');
        const s = escapeSet(e);
        if (s !== undefined) {
          for (let b = 0; b < 128; b++) if (s.ascii[b] === 1) ascii[b] = 1;
          if (s.multi) multiChars = true;
          continue;
        }
        c = escapeChar(e);
      }
      let hi = c;
      if (peek() === '-' && cps[i + 1] !== undefined && cps[i + 1] !== ']') {
        i++;
        hi = cps[i++]!;
        if (hi === '\\') hi = escapeChar(cps[i++] ?? bad(pattern, i, 'dangling escape'));
      }
      const a = c.codePointAt(0)!;
      const z = hi.codePointAt(0)!;
      if (z < a) bad(pattern, i, `range ${c}-${hi} is reversed`);
      if (z >= 128) bad(pattern, i, 'character classes with non-ASCII characters are not supported');
      for (let b = a; b <= z; b++) ascii[b] = 1;
    }
    if (peek() !== ']') bad(pattern, i, 'unterminated character class');
    i++;
    if (multiChars && !negate) return { ascii, multi: true };
    return negate ? { ascii: invert(ascii), multi: !multiChars } : { ascii, multi: false };
  };
  const parseAtom = (): Expr => {
    const c = cps[i++]!;
    switch (c) {
      case '(': {
        if (peek() === '?') {
          if (cps[i + 1] !== ':') bad(pattern, i, 'lookaround and named groups are not supported');
          i += 2;
        }
        const e = parseAlt();
        if (peek() !== ')') bad(pattern, i, 'unbalanced parenthesis');
        i++;
        return e;
      }
      case '[': return setExpr(parseClass());
      case '.': return setExpr({ ascii: invert(setOf(0x0a)), multi: true });
      case '\\': {
        const e = cps[i++] ?? bad(pattern, i, 'dangling escape');
        const s = escapeSet(e);
        return s !== undefined ? setExpr(s) : charExpr(escapeChar(e));
      }
      case '*': case '+': case '?': case '{': return bad(pattern, i - 1, `nothing to repeat before '${c}'`);
      case ')': return bad(pattern, i - 1, 'unbalanced parenthesis');
      default: return charExpr(c);
    }
  };
  const parseRepeat = (): Expr => {
    let e = parseAtom();
    for (;;) {
      const c = peek();
      let min: number;
      let max: number;
      if (c === '*') [min, max] = [0, Infinity];
      else if (c === '+') [min, max] = [1, Infinity];
      else if (c === '?') [min, max] = [0, 1];
      else if (c === '{') {
        const m = /^\{(\d+)(,(\d*))?\}/.exec(cps.slice(i).join(''));
        if (m === null) return bad(pattern, i, "malformed '{n,m}' quantifier");
        min = Number(m[1]);
        max = m[2] === undefined ? min : m[3] === '' ? Infinity : Number(m[3]);
        if (max < min) bad(pattern, i, `quantifier {${String(min)},${String(max)}} is reversed`);
        i += Array.from(m[0]).length - 1;
      } else return e;
      i++;
      if (peek() === '?' || peek() === '+') i++;
      e = rep(e, min, max);
    }
  };
  const parseSeq = (): Expr => {
    const items: Expr[] = [];
    while (i < cps.length && peek() !== '|' && peek() !== ')') {
      if (peek() === '^' && i === 0) {
        i++;
        continue;
      }
      if (peek() === '$' && i === cps.length - 1) {
        i++;
        continue;
      }
      if (peek() === '^' || peek() === '$') bad(pattern, i, 'anchors are supported only at the ends');
      items.push(parseRepeat());
    }
    return items.length === 0 ? EMPTY : seq(...items);
  };
  function parseAlt(): Expr {
    const items = [parseSeq()];
    while (peek() === '|') {
      i++;
      items.push(parseSeq());
    }
    return alt(...items);
  }
  const e = parseAlt();
  if (i < cps.length) bad(pattern, i, 'unbalanced parenthesis');
  return e;
}

/** The grammar of the strings `pattern` fully matches (see `compileRegexBody`). */
export function regexGrammar(pattern: string): Grammar {
  return { rules: new Map([['root', compileRegexBody(pattern)]]), root: 'root' };
}
