import { type Dim, type DimBindings, checkDim, evalDim } from './dim.js';
import { type DType, isDType } from './dtype.js';
import { IrCode, IrError, type NodeRef } from './errors.js';

/** A literal attribute value as stored in a graph. */
export type AttrValue = boolean | number | string | readonly number[] | Dim | readonly Dim[];

interface SpecBase {
  /** Whether the attribute may be absent (and has no default). */
  readonly optional?: boolean;
}
/** A boolean attribute. */
export interface BoolAttrSpec extends SpecBase {
  readonly kind: 'bool';
  readonly default?: boolean;
}
/** An integer attribute, optionally bounded below. */
export interface IntAttrSpec extends SpecBase {
  readonly kind: 'int';
  readonly default?: number;
  readonly min?: number;
}
/** A floating-point attribute (NaN and infinities allowed). */
export interface FloatAttrSpec extends SpecBase {
  readonly kind: 'float';
  readonly default?: number;
}
/** One of a fixed set of strings. */
export interface EnumAttrSpec<V extends string = string> extends SpecBase {
  readonly kind: 'enum';
  readonly values: readonly V[];
  readonly default?: V;
}
/** A list of integers (axes, permutations). */
export interface IntsAttrSpec extends SpecBase {
  readonly kind: 'ints';
  readonly default?: readonly number[];
}
/** A list of floats (constant payloads). */
export interface FloatsAttrSpec extends SpecBase {
  readonly kind: 'floats';
  readonly default?: readonly number[];
}
/** One dimension, possibly symbolic (slice bounds). */
export interface DimAttrSpec extends SpecBase {
  readonly kind: 'dim';
  readonly default?: Dim;
}
/** A shape, possibly symbolic (reshape targets). */
export interface DimsAttrSpec extends SpecBase {
  readonly kind: 'dims';
  readonly default?: readonly Dim[];
}
/** An element type. */
export interface DTypeAttrSpec extends SpecBase {
  readonly kind: 'dtype';
  readonly default?: DType;
}

/** Any attribute specification. */
export type AttrSpec =
  | BoolAttrSpec
  | IntAttrSpec
  | FloatAttrSpec
  | EnumAttrSpec
  | IntsAttrSpec
  | FloatsAttrSpec
  | DimAttrSpec
  | DimsAttrSpec
  | DTypeAttrSpec;

/** An op's attribute schema: name → spec. */
export type AttrSchema = Readonly<Record<string, AttrSpec>>;

/** The TypeScript type of one attribute's value. */
export type AttrTsType<S extends AttrSpec> = S extends BoolAttrSpec
  ? boolean
  : S extends IntAttrSpec | FloatAttrSpec
    ? number
    : S extends EnumAttrSpec<infer V>
      ? V
      : S extends IntsAttrSpec | FloatsAttrSpec
        ? readonly number[]
        : S extends DimAttrSpec
          ? Dim
          : S extends DimsAttrSpec
            ? readonly Dim[]
            : S extends DTypeAttrSpec
              ? DType
              : never;

type OptionalKeys<A extends AttrSchema> = {
  [K in keyof A]: A[K] extends { optional: true } ? K : never;
}[keyof A];
type DefaultedKeys<A extends AttrSchema> = {
  [K in keyof A]: A[K] extends { default: unknown } ? K : never;
}[keyof A];

/** Attribute values after normalization: defaults filled in, optional ones possibly absent. */
export type AttrValues<A extends AttrSchema> = {
  readonly [K in Exclude<keyof A, OptionalKeys<A>>]: AttrTsType<A[K]>;
} & {
  readonly [K in OptionalKeys<A>]?: AttrTsType<A[K]>;
};

/** Attribute values a builder call accepts: attributes with defaults (or optional) may be omitted. */
export type AttrInput<A extends AttrSchema> = {
  readonly [K in Exclude<keyof A, OptionalKeys<A> | DefaultedKeys<A>>]: AttrTsType<A[K]>;
} & {
  readonly [K in OptionalKeys<A> | DefaultedKeys<A>]?: AttrTsType<A[K]>;
};

/** Constructors of attribute specs, keeping literal types for `AttrValues`. */
export const attr = {
  /** A boolean. */
  bool: <O extends Omit<BoolAttrSpec, 'kind'>>(o: O): { kind: 'bool' } & O => ({ kind: 'bool', ...o }),
  /** An integer. */
  int: <O extends Omit<IntAttrSpec, 'kind'>>(o: O): { kind: 'int' } & O => ({ kind: 'int', ...o }),
  /** A float. */
  float: <O extends Omit<FloatAttrSpec, 'kind'>>(o: O): { kind: 'float' } & O => ({ kind: 'float', ...o }),
  /** One of `values`. */
  enum: <const V extends string, O extends { default?: NoInfer<V>; optional?: boolean }>(
    values: readonly V[],
    o: O,
  ): { kind: 'enum'; values: readonly V[] } & O => ({ kind: 'enum', values, ...o }),
  /** A list of integers. */
  ints: <O extends Omit<IntsAttrSpec, 'kind'>>(o: O): { kind: 'ints' } & O => ({ kind: 'ints', ...o }),
  /** A list of floats. */
  floats: <O extends Omit<FloatsAttrSpec, 'kind'>>(o: O): { kind: 'floats' } & O => ({ kind: 'floats', ...o }),
  /** A dimension. */
  dim: <O extends Omit<DimAttrSpec, 'kind'>>(o: O): { kind: 'dim' } & O => ({ kind: 'dim', ...o }),
  /** A shape. */
  dims: <O extends Omit<DimsAttrSpec, 'kind'>>(o: O): { kind: 'dims' } & O => ({ kind: 'dims', ...o }),
  /** A dtype. */
  dtype: <O extends Omit<DTypeAttrSpec, 'kind'>>(o: O): { kind: 'dtype' } & O => ({ kind: 'dtype', ...o }),
};

function bad(op: string, name: string, msg: string, at: NodeRef | undefined): never {
  throw new IrError(IrCode.BAD_ATTR, `${op}: attribute '${name}' ${msg}`, { at });
}

function checkValue(op: string, name: string, spec: AttrSpec, v: unknown, at: NodeRef | undefined): AttrValue {
  switch (spec.kind) {
    case 'bool':
      if (typeof v !== 'boolean') bad(op, name, 'must be a boolean', at);
      return v;
    case 'int':
      if (typeof v !== 'number' || !Number.isSafeInteger(v)) bad(op, name, 'must be an integer', at);
      if (spec.min !== undefined && v < spec.min) bad(op, name, `must be ≥ ${String(spec.min)}, got ${String(v)}`, at);
      return v;
    case 'float':
      if (typeof v !== 'number') bad(op, name, 'must be a number', at);
      return v;
    case 'enum':
      if (typeof v !== 'string' || !spec.values.includes(v)) {
        bad(op, name, `must be one of ${spec.values.map((x) => `"${x}"`).join(', ')}`, at);
      }
      return v;
    case 'ints':
      if (!Array.isArray(v) || !v.every((x) => typeof x === 'number' && Number.isSafeInteger(x))) {
        bad(op, name, 'must be a list of integers', at);
      }
      return [...(v as number[])];
    case 'floats':
      if (!Array.isArray(v) || !v.every((x) => typeof x === 'number')) bad(op, name, 'must be a list of numbers', at);
      return [...(v)];
    case 'dim':
      return checkDimAttr(op, name, v, at);
    case 'dims':
      if (!Array.isArray(v)) bad(op, name, 'must be a list of dims', at);
      return (v as unknown[]).map((d) => checkDimAttr(op, name, d, at));
    case 'dtype':
      if (typeof v !== 'string' || !isDType(v)) bad(op, name, 'must be a dtype', at);
      return v;
  }
}

function checkDimAttr(op: string, name: string, v: unknown, at: NodeRef | undefined): Dim {
  // NOTE: dim attributes may be negative integers (slice bounds count from the end), so they are
  // checked as integers here rather than with checkDim's non-negativity rule.
  if (typeof v === 'number') {
    if (!Number.isSafeInteger(v)) bad(op, name, 'must be an integer dim', at);
    return v;
  }
  try {
    return checkDim(v, `attribute '${name}'`);
  } catch {
    return bad(op, name, 'must be an integer or symbolic dim', at);
  }
}

/**
 * Validates attributes against a schema and fills defaults. Unknown names, missing required ones
 * and wrongly typed values throw `IR_BAD_ATTR`.
 */
export function normalizeAttrs(
  op: string,
  schema: AttrSchema,
  input: Readonly<Record<string, unknown>>,
  at?: NodeRef,
): Record<string, AttrValue> {
  for (const k of Object.keys(input)) {
    if (!Object.hasOwn(schema, k)) {
      const known = Object.keys(schema);
      bad(op, k, `is not an attribute of ${op}${known.length > 0 ? ` (known: ${known.join(', ')})` : ''}`, at);
    }
  }
  const out: Record<string, AttrValue> = {};
  for (const [name, spec] of Object.entries(schema)) {
    const v = input[name];
    if (v === undefined) {
      if (spec.default !== undefined) out[name] = spec.default;
      else if (spec.optional !== true) bad(op, name, 'is required', at);
      continue;
    }
    out[name] = checkValue(op, name, spec, v, at);
  }
  return out;
}

/** Replaces symbolic dims in dim/dims attributes by their values under `bindings`. */
export function concretizeAttrs(
  schema: AttrSchema,
  attrs: Readonly<Record<string, AttrValue>>,
  bindings: DimBindings,
): Record<string, AttrValue> {
  const out: Record<string, AttrValue> = { ...attrs };
  for (const [name, spec] of Object.entries(schema)) {
    const v = attrs[name];
    if (v === undefined) continue;
    if (spec.kind === 'dim') out[name] = evalDim(v as Dim, bindings);
    else if (spec.kind === 'dims') out[name] = (v as readonly Dim[]).map((d) => evalDim(d, bindings));
  }
  return out;
}

/** Whether an attribute value equals the spec's default (printers omit those). */
export function isDefaultAttr(spec: AttrSpec, v: AttrValue): boolean {
  if (spec.default === undefined) return false;
  return JSON.stringify(spec.default) === JSON.stringify(v) && !(typeof v === 'number' && Object.is(v, -0));
}
