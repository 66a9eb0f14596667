import { StructuredCode, StructuredError } from './errors.js';
import { type Expr, type Grammar, EMPTY, alt, byteSet, bytes, charClass, lit, opt, ref, rep, seq } from './grammar.js';
import { compileRegexBody } from './regex.js';

type Schema = Readonly<Record<string, unknown>>;

const DIGIT = bytes(byteSet([0x30, 0x39]));
const DIGIT19 = bytes(byteSet([0x31, 0x39]));
const digit = (lo: number, hi: number): Expr => bytes(byteSet([0x30 + lo, 0x30 + hi]));
const HEX = bytes(byteSet([0x30, 0x39], [0x41, 0x46], [0x61, 0x66]));

/** A JSON string's character: unescaped printable (no `"`, `\`, control) or an escape. */
const STRING_CHAR: Expr = alt(
  charClass(byteSet(0x20, 0x21, [0x23, 0x5b], [0x5d, 0x7e]), true),
  seq(lit('\\'), alt(bytes(byteSet(0x22, 0x5c, 0x2f, 0x62, 0x66, 0x6e, 0x72, 0x74)), seq(lit('u'), HEX, HEX, HEX, HEX))),
);
const UNSIGNED_INT = alt(lit('0'), seq(DIGIT19, rep(DIGIT, 0, Infinity)));
const INTEGER = seq(opt(lit('-')), UNSIGNED_INT);
const FRACTION = seq(lit('.'), rep(DIGIT, 1, Infinity));
const EXPONENT = seq(bytes(byteSet(0x65, 0x45)), opt(bytes(byteSet(0x2b, 0x2d))), rep(DIGIT, 1, Infinity));
const NUMBER = seq(INTEGER, opt(FRACTION), opt(EXPONENT));
const STRING = seq(lit('"'), rep(STRING_CHAR, 0, Infinity), lit('"'));

/** The rules of any JSON value (compact: no whitespace between tokens), for `json_object` and `{}`. */
function addAnyJson(rules: Map<string, Expr>): void {
  if (rules.has('json_value')) return;
  rules.set('json_value', alt(ref('json_object'), ref('json_array'), STRING, NUMBER, lit('true'), lit('false'), lit('null')));
  rules.set('json_object', seq(lit('{'), opt(seq(STRING, lit(':'), ref('json_value'), rep(seq(lit(','), STRING, lit(':'), ref('json_value')), 0, Infinity))), lit('}')));
  rules.set('json_array', seq(lit('['), opt(seq(ref('json_value'), rep(seq(lit(','), ref('json_value')), 0, Infinity))), lit(']')));
}

/** Any JSON object, as `response_format: {type: 'json_object'}` asks. */
export function jsonObjectGrammar(): Grammar {
  const rules = new Map<string, Expr>();
  addAnyJson(rules);
  return { rules, root: 'json_object' };
}

/** The decimal digits of a non-negative integer. */
const digitsOf = (n: number): number[] => Array.from(String(n), (c) => c.charCodeAt(0) - 0x30);

/** Integers in [lo, hi], both non-negative and with the same number of digits (no leading zeros). */
function sameLengthRange(lo: number[], hi: number[]): Expr {
  if (lo.length === 0) return EMPTY;
  const [a, ...la] = lo;
  const [b, ...lb] = hi;
  if (a === b) return seq(digit(a!, a!), sameLengthRange(la, lb));
  const n = la.length;
  const allZero = la.every((d) => d === 0);
  const allNine = lb.every((d) => d === 9);
  const parts: Expr[] = [];
  let from = a!;
  let to = b!;
  if (!allZero) {
    parts.push(seq(digit(a!, a!), sameLengthRange(la, new Array<number>(n).fill(9))));
    from = a! + 1;
  }
  if (!allNine) {
    parts.push(seq(digit(b!, b!), sameLengthRange(new Array<number>(n).fill(0), lb)));
    to = b! - 1;
  }
  if (from <= to) parts.push(seq(digit(from, to), rep(DIGIT, n, n)));
  return alt(...parts);
}

/** Non-negative integers in [lo, hi] (hi may be Infinity), in canonical decimal. */
function natRange(lo: number, hi: number): Expr | undefined {
  if (lo > hi) return undefined;
  const parts: Expr[] = [];
  const lenLo = String(lo).length;
  const lenHi = hi === Infinity ? Infinity : String(hi).length;
  for (let len = lenLo; len <= Math.min(lenHi, 17); len++) {
    const a = len === lenLo ? lo : 10 ** (len - 1);
    const b = len === lenHi ? hi : 10 ** len - 1;
    if (len === 1) parts.push(digit(a, b));
    else parts.push(sameLengthRange(digitsOf(a), digitsOf(b)));
  }
  if (lenHi === Infinity) parts.push(seq(DIGIT19, rep(DIGIT, 17, Infinity)));
  return alt(...parts);
}

/** Integers in [lo, hi] (either may be infinite), canonical decimal. */
function intRange(lo: number, hi: number): Expr | undefined {
  const parts: Expr[] = [];
  const pos = natRange(Math.max(lo, 0), hi);
  if (pos !== undefined && hi >= 0) parts.push(pos);
  if (lo < 0) {
    const neg = natRange(Math.max(1, -hi), -lo);
    if (neg !== undefined) parts.push(seq(lit('-'), neg));
  }
  return parts.length === 0 ? undefined : alt(...parts);
}

function num(s: Schema, key: string): number | undefined {
  const v = s[key];
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || Number.isNaN(v)) throw new StructuredError(StructuredCode.BAD_SCHEMA, `'${key}' must be a number, got ${JSON.stringify(v)}`);
  return v;
}

/** Integer bounds [lo, hi] from minimum/maximum/exclusive* (draft 6+ numbers, draft 4 booleans). */
function intBounds(s: Schema): [number, number] {
  let lo = -Infinity;
  let hi = Infinity;
  const min = num(s, 'minimum');
  const max = num(s, 'maximum');
  const exMin = s['exclusiveMinimum'];
  const exMax = s['exclusiveMaximum'];
  if (min !== undefined) lo = exMin === true ? Math.floor(min) + 1 : Math.ceil(min);
  if (max !== undefined) hi = exMax === true ? Math.ceil(max) - 1 : Math.floor(max);
  if (typeof exMin === 'number') lo = Math.max(lo, Math.floor(exMin) + 1);
  if (typeof exMax === 'number') hi = Math.min(hi, Math.ceil(exMax) - 1);
  for (const v of [lo, hi]) if (Number.isFinite(v) && !Number.isSafeInteger(v)) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, `numeric bound ${String(v)} is beyond 2^53`);
  return [lo, hi];
}

const SUPPORTED = new Set([
  'type', 'properties', 'required', 'additionalProperties', 'items', 'minItems', 'maxItems', 'enum', 'const', 'anyOf', 'oneOf', 'allOf',
  'minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'minLength', 'maxLength', 'pattern', '$ref', '$defs', 'definitions',
  // Annotations without effect on validity.
  'title', 'description', 'default', 'examples', '$schema', '$id', '$comment', 'strict', 'format', 'nullable', 'readOnly', 'writeOnly', 'deprecated',
]);

/** Options of `jsonSchemaGrammar`. */
export interface JsonSchemaOptions {
  /**
   * OpenAI's `strict`: objects take only their listed properties, as if each had
   * `additionalProperties: false` (default false: an object allows extra properties only when
   * its schema says `additionalProperties: true` or gives a schema for them).
   */
  readonly strict?: boolean;
}

/**
 * A grammar of the JSON texts valid against `schema` (compact: no whitespace between tokens,
 * properties in the schema's order). Supported: `type` (one or a list), `properties`, `required`,
 * `additionalProperties`, `items`, `minItems`/`maxItems`, `enum`, `const`, `anyOf`, `oneOf` (as
 * anyOf), `allOf` of one schema, integer and number bounds (number bounds keep a subset of the
 * valid values: integer parts within the integer bounds), `minLength`/`maxLength`, `pattern`
 * (an anchored regex over the unescaped characters), `$ref` to `#`, `#/$defs/…` or
 * `#/definitions/…` (recursion allowed), `nullable`. `format` is not enforced. Anything else that
 * constrains values (`not`, `if`, `patternProperties`, `prefixItems`, …) is
 * `STRUCT_UNSUPPORTED_SCHEMA`, naming the keyword.
 */
export function jsonSchemaGrammar(schema: unknown, opts: JsonSchemaOptions = {}): Grammar {
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) {
    if (schema === true) return { rules: new Map([['root', ref('json_value')]]), root: 'root' };
    throw new StructuredError(StructuredCode.BAD_SCHEMA, 'the JSON schema must be an object');
  }
  const rootSchema = schema as Schema;
  const rules = new Map<string, Expr>();
  const refRules = new Map<string, string>();
  const strict = opts.strict ?? false;

  const resolve = (path: string): Schema => {
    if (path === '#') return rootSchema;
    const m = /^#\/(\$defs|definitions)\/(.+)$/.exec(path);
    if (m === null) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, `$ref '${path}' is not supported (only '#', '#/$defs/…' and '#/definitions/…')`);
    const defs = rootSchema[m[1]!] as Record<string, unknown> | undefined;
    const name = m[2]!.replaceAll('~1', '/').replaceAll('~0', '~');
    const target = defs?.[name];
    if (typeof target !== 'object' || target === null) throw new StructuredError(StructuredCode.BAD_SCHEMA, `$ref '${path}' points at nothing`);
    return target as Schema;
  };

  const stringExpr = (s: Schema): Expr => {
    const minL = num(s, 'minLength') ?? 0;
    const maxL = num(s, 'maxLength') ?? Infinity;
    if (typeof s['pattern'] === 'string') {
      if (s['minLength'] !== undefined || s['maxLength'] !== undefined) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, "'pattern' together with 'minLength'/'maxLength' is not supported");
      return seq(lit('"'), compileRegexBody(s['pattern'], { jsonString: true }), lit('"'));
    }
    if (!(Number.isInteger(minL) && minL >= 0 && (maxL === Infinity || (Number.isInteger(maxL) && maxL >= minL)))) {
      throw new StructuredError(StructuredCode.BAD_SCHEMA, `bad string length bounds [${String(minL)}, ${String(maxL)}]`);
    }
    return seq(lit('"'), rep(STRING_CHAR, minL, maxL), lit('"'));
  };

  const numberExpr = (s: Schema, integer: boolean): Expr => {
    const bounded = ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum'].some((k) => s[k] !== undefined && s[k] !== false);
    if (!bounded) return integer ? INTEGER : NUMBER;
    const [lo, hi] = intBounds(s);
    const whole = intRange(lo, hi);
    if (integer) {
      if (whole === undefined) throw new StructuredError(StructuredCode.BAD_SCHEMA, `no integer lies within the bounds [${String(num(s, 'minimum'))}, ${String(num(s, 'maximum'))}]`);
      return whole;
    }
    // A fraction after integer part I keeps the value within [I, I + 1) (or (I - 1, I] when negative).
    const parts: Expr[] = [];
    if (whole !== undefined) parts.push(whole);
    const posFrac = natRange(Math.max(lo, 0), hi - 1);
    if (posFrac !== undefined && hi - 1 >= 0) parts.push(seq(posFrac, FRACTION));
    const negFrac = natRange(Math.max(1, -hi), -lo - 1);
    if (negFrac !== undefined && lo < 0) parts.push(seq(lit('-'), negFrac, FRACTION));
    if (parts.length === 0) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, 'number bounds narrower than one integer step are not supported');
    return alt(...parts);
  };

  const objectExpr = (s: Schema, path: string): Expr => {
    const props = (s['properties'] ?? {}) as Record<string, unknown>;
    if (typeof props !== 'object' || Array.isArray(props)) throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: 'properties' must be an object`);
    const required = new Set((s['required'] ?? []) as string[]);
    if (!Array.isArray(s['required'] ?? [])) throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: 'required' must be a list of names`);
    for (const r of required) if (!(r in props)) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, `${path}: required property '${r}' has no schema in 'properties'`);
    const ap = s['additionalProperties'];
    const extra: Expr | undefined = strict || ap === false || ap === undefined ? undefined : seq(STRING, lit(':'), ap === true ? ref('json_value') : expr(ap, `${path}/additionalProperties`));
    if (extra !== undefined) addAnyJson(rules);
    const names = Object.keys(props);
    const member = names.map((n, i) => seq(lit(`${JSON.stringify(n)}:`), expr(props[n], `${path}/properties/${String(i)}`)));
    // Memoize the chain as rules, so optional members do not duplicate the rest of the object.
    const base = `${path}#obj`;
    const ruleOf = (i: number, emitted: boolean): Expr => {
      const name = `${base}/${String(i)}${emitted ? 'e' : 'n'}`;
      if (!rules.has(name)) {
        rules.set(name, EMPTY);
        const comma = emitted ? lit(',') : EMPTY;
        let body: Expr;
        if (i === names.length) body = extra === undefined ? EMPTY : emitted ? rep(seq(comma, extra), 0, Infinity) : opt(seq(extra, rep(seq(lit(','), extra), 0, Infinity)));
        else {
          const take = seq(comma, member[i]!, ruleOf(i + 1, true));
          body = required.has(names[i]!) ? take : alt(take, ruleOf(i + 1, emitted));
        }
        rules.set(name, body);
      }
      return ref(name);
    };
    return seq(lit('{'), ruleOf(0, false), lit('}'));
  };

  const arrayExpr = (s: Schema, path: string): Expr => {
    const items = s['items'] === undefined ? true : s['items'];
    if (Array.isArray(items)) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, `${path}: tuple 'items' (a list) is not supported`);
    const item = expr(items, `${path}/items`);
    const minI = num(s, 'minItems') ?? 0;
    const maxI = num(s, 'maxItems') ?? Infinity;
    if (!(Number.isInteger(minI) && minI >= 0 && (maxI === Infinity || (Number.isInteger(maxI) && maxI >= minI)))) throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: bad item count bounds [${String(minI)}, ${String(maxI)}]`);
    if (maxI === 0) return lit('[]');
    const more = rep(seq(lit(','), item), Math.max(0, minI - 1), maxI - 1);
    const some = seq(item, more);
    return seq(lit('['), minI === 0 ? opt(some) : some, lit(']'));
  };

  const typed = (s: Schema, t: string, path: string): Expr => {
    switch (t) {
      case 'string': return stringExpr(s);
      case 'integer': return numberExpr(s, true);
      case 'number': return numberExpr(s, false);
      case 'boolean': return alt(lit('true'), lit('false'));
      case 'null': return lit('null');
      case 'object': return objectExpr(s, path);
      case 'array': return arrayExpr(s, path);
      default: throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: unknown type '${t}'`);
    }
  };

  function expr(node: unknown, path: string): Expr {
    if (node === true || (typeof node === 'object' && node !== null && Object.keys(node).length === 0)) {
      addAnyJson(rules);
      return ref('json_value');
    }
    if (typeof node !== 'object' || node === null || Array.isArray(node)) throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: a schema must be an object or true`);
    const s = node as Schema;
    for (const k of Object.keys(s)) if (!SUPPORTED.has(k)) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, `${path}: keyword '${k}' is not supported`);
    if (typeof s['$ref'] === 'string') {
      const target = s['$ref'];
      let name = refRules.get(target);
      if (name === undefined) {
        name = `ref:${target}`;
        refRules.set(target, name);
        rules.set(name, EMPTY);
        rules.set(name, expr(resolve(target), target));
      }
      return ref(name);
    }
    if ('const' in s) return lit(JSON.stringify(s['const']));
    if (Array.isArray(s['enum'])) {
      if (s['enum'].length === 0) throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: 'enum' is empty`);
      return alt(...s['enum'].map((v) => lit(JSON.stringify(v))));
    }
    const branches = (s['anyOf'] ?? s['oneOf']);
    if (branches !== undefined) {
      if (!Array.isArray(branches) || branches.length === 0) throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: 'anyOf'/'oneOf' must be a non-empty list`);
      return alt(...branches.map((b, i) => expr(b, `${path}/anyOf/${String(i)}`)));
    }
    if (s['allOf'] !== undefined) {
      const all = s['allOf'];
      if (!Array.isArray(all) || all.length !== 1) throw new StructuredError(StructuredCode.UNSUPPORTED_SCHEMA, `${path}: 'allOf' with more than one schema is not supported`);
      return expr(all[0], `${path}/allOf/0`);
    }
    let types = s['type'];
    if (types === undefined) {
      if (s['properties'] !== undefined) types = 'object';
      else if (s['items'] !== undefined) types = 'array';
      else {
        addAnyJson(rules);
        return ref('json_value');
      }
    }
    const list = Array.isArray(types) ? (types as unknown[]) : [types];
    const out = list.map((t) => {
      if (typeof t !== 'string') throw new StructuredError(StructuredCode.BAD_SCHEMA, `${path}: 'type' must be a string or a list of strings`);
      return typed(s, t, path);
    });
    if (s['nullable'] === true && !list.includes('null')) out.push(lit('null'));
    return alt(...out);
  }

  rules.set('root', EMPTY);
  rules.set('root', expr(rootSchema, '#'));
  return { rules, root: 'root' };
}
