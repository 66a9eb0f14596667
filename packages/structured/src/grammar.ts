/**
 * The grammar IR every constraint compiles to: rules of byte-level expressions (a byte set, a
 * sequence, an alternation, a bounded or unbounded repetition, a rule reference). Text is UTF-8;
 * a non-ASCII character is its byte sequence.
 */
export type Expr =
  | { readonly k: 'bytes'; readonly set: Uint8Array }
  | { readonly k: 'seq'; readonly items: readonly Expr[] }
  | { readonly k: 'alt'; readonly items: readonly Expr[] }
  | { readonly k: 'rep'; readonly item: Expr; readonly min: number; readonly max: number }
  | { readonly k: 'ref'; readonly name: string };

/** Named rules and the root rule's name. */
export interface Grammar {
  readonly rules: ReadonlyMap<string, Expr>;
  readonly root: string;
}

const enc = new TextEncoder();

/** A set of one byte value per listed byte or inclusive range. */
export function byteSet(...parts: readonly (number | readonly [number, number])[]): Uint8Array {
  const s = new Uint8Array(256);
  for (const p of parts) {
    if (typeof p === 'number') s[p] = 1;
    else for (let b = p[0]; b <= p[1]; b++) s[b] = 1;
  }
  return s;
}

/** One byte of `set`. */
export const bytes = (set: Uint8Array): Expr => ({ k: 'bytes', set });
/** Items in order. */
export const seq = (...items: Expr[]): Expr => (items.length === 1 ? items[0]! : { k: 'seq', items });
/** One of the items. */
export const alt = (...items: Expr[]): Expr => (items.length === 1 ? items[0]! : { k: 'alt', items });
/** `item` repeated min..max times (max Infinity: unbounded). */
export const rep = (item: Expr, min: number, max: number): Expr => ({ k: 'rep', item, min, max });
/** Zero or one `item`. */
export const opt = (item: Expr): Expr => rep(item, 0, 1);
/** A reference to the rule `name`. */
export const ref = (name: string): Expr => ({ k: 'ref', name });
/** The empty string. */
export const EMPTY: Expr = { k: 'seq', items: [] };

/** The UTF-8 bytes of `text`, literally. */
export function lit(text: string): Expr {
  const b = enc.encode(text);
  return seq(...Array.from(b, (x) => bytes(byteSet(x))));
}

const CONT = byteSet([0x80, 0xbf]);
/** One well-formed multi-byte UTF-8 character (U+0080 and above; surrogates excluded). */
export const UTF8_MULTI: Expr = alt(
  seq(bytes(byteSet([0xc2, 0xdf])), bytes(CONT)),
  seq(bytes(byteSet(0xe0)), bytes(byteSet([0xa0, 0xbf])), bytes(CONT)),
  seq(bytes(byteSet([0xe1, 0xec], [0xee, 0xef])), bytes(CONT), bytes(CONT)),
  seq(bytes(byteSet(0xed)), bytes(byteSet([0x80, 0x9f])), bytes(CONT)),
  seq(bytes(byteSet(0xf0)), bytes(byteSet([0x90, 0xbf])), bytes(CONT), bytes(CONT)),
  seq(bytes(byteSet([0xf1, 0xf3])), bytes(CONT), bytes(CONT), bytes(CONT)),
  seq(bytes(byteSet(0xf4)), bytes(byteSet([0x80, 0x8f])), bytes(CONT), bytes(CONT)),
);

/** Any one character: an ASCII byte of `ascii`, or (when `multi`) any multi-byte UTF-8 character. */
export function charClass(ascii: Uint8Array, multi: boolean): Expr {
  const a = ascii.slice(0, 128);
  const s = new Uint8Array(256);
  s.set(a);
  const any = a.some((x) => x === 1);
  if (!multi) return bytes(s);
  return any ? alt(bytes(s), UTF8_MULTI) : UTF8_MULTI;
}
