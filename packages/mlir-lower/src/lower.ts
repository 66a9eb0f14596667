import {
  type Graph,
  type HostTensor,
  type OpKey,
  type TensorType,
  dimSub,
  dimSymbols,
  opDef,
  typeToString,
  verifyGraph,
} from '@stageml/ir';
import { FunctionEmitter, type ValueRef } from './emitter.js';
import { LowerCode, LowerError } from './errors.js';
import { denseAttr, isSplat, resourceBlob, resourceSection } from './literals.js';
import { type RuleContext, isUnsupported } from './rule.js';
import { mlirRuleOf } from './rules.js';
import { tensorTypeOf } from './types.js';

/** Where constants larger than the inline limit go. */
export type ConstantsMode = 'args' | 'resources';

/** Options of `lowerToMlir`. */
export interface MlirLowerOptions {
  /** Name of the emitted function (default: the graph's name, sanitized). */
  readonly functionName?: string;
  /** Constants with at most this many elements become `dense<…>` literals (default 16). */
  readonly inlineLimit?: number;
  /**
   * Larger constants become function arguments (`args`, the default: the caller passes the
   * bundle's tensors) or `dense_resource` blobs in the module's `dialect_resources` section.
   */
  readonly constants?: ConstantsMode;
}

/** One argument of the emitted function. */
export interface MlirArgument {
  /** The IR name (input, parameter or constant value). */
  readonly name: string;
  /** `input`: a residual input; `param`: a parameter with no value given; `constant`: a value the caller passes. */
  readonly kind: 'input' | 'param' | 'constant';
  /** IR type. */
  readonly type: TensorType;
  /** MLIR type (`tensor<?x64xf32>`). */
  readonly mlirType: string;
  /** The tensor to pass, for `constant` arguments. */
  readonly value?: HostTensor;
}

/** One result of the emitted function, in graph output order. */
export interface MlirResult {
  /** Output name. */
  readonly name: string;
  readonly type: TensorType;
  readonly mlirType: string;
}

/** A `dense_resource` blob the function refers to. */
export interface MlirResource {
  /** Resource key (`dense_resource<key>`). */
  readonly key: string;
  readonly value: HostTensor;
}

/** One lowered function: its text and signature. */
export interface MlirFunction {
  /** Symbol name (without `@`). */
  readonly name: string;
  /** The `func.func … { … }` text. */
  readonly text: string;
  readonly arguments: readonly MlirArgument[];
  readonly results: readonly MlirResult[];
  /** Blobs for the module's resource section (`constants: 'resources'` only). */
  readonly resources: readonly MlirResource[];
}

/** A lowered module: its text and its one function's signature. */
export interface MlirModule {
  /** The whole module: header comments, `module { … }` and the resource section. */
  readonly text: string;
  readonly function: MlirFunction;
}

const SYMBOL = /[^A-Za-z0-9_$.]/g;

function symbolName(name: string): string {
  const s = name.replace(SYMBOL, '_');
  return /^[A-Za-z_]/.test(s) ? s : `_${s}`;
}

function checkOptions(opts: MlirLowerOptions): { inlineLimit: number; mode: ConstantsMode } {
  const inlineLimit = opts.inlineLimit ?? 16;
  if (!Number.isSafeInteger(inlineLimit) || inlineLimit < 0) throw new LowerError(LowerCode.BAD_OPTIONS, `inlineLimit must be a non-negative integer, got ${String(opts.inlineLimit)}`);
  // NOTE: checked at run time too: JavaScript callers and the CLI pass unchecked strings.
  const mode: string = opts.constants ?? 'args';
  if (mode !== 'args' && mode !== 'resources') throw new LowerError(LowerCode.BAD_OPTIONS, `constants must be 'args' or 'resources', got '${mode}'`);
  if (opts.functionName?.trim() === '') throw new LowerError(LowerCode.BAD_OPTIONS, 'functionName must not be empty');
  return { inlineLimit, mode };
}

function checkConstant(graph: Graph, name: string, want: TensorType, t: HostTensor): void {
  const ok = t.dtype === want.dtype && t.shape.length === want.shape.length && want.shape.every((d, i) => typeof d === 'number' && d === t.shape[i]);
  if (!ok) {
    throw new LowerError(LowerCode.BAD_CONSTANT, `constant '${name}' is ${t.dtype}[${t.shape.join(', ')}], the graph declares ${typeToString(want)}`, { at: { graph: graph.name, value: name } });
  }
}

/** Binds every symbol the arguments' shapes determine: plain symbols, then linear combinations. */
function bindSymbols(e: FunctionEmitter, args: readonly ValueRef[]): void {
  for (const a of args) {
    a.type.shape.forEach((d, axis) => {
      if (typeof d !== 'number' && d.constant === 0 && d.terms.length === 1 && d.terms[0]!.coef === 1 && d.terms[0]!.vars.length === 1) e.bindSymbol(d.terms[0]!.vars[0]!, a, axis);
    });
  }
  // e.g. attention_mask [batch, past + seq] binds `past` once `seq` is known: past = dim − seq.
  for (let progress = true; progress; ) {
    progress = false;
    for (const a of args) {
      a.type.shape.forEach((d, axis) => {
        if (typeof d === 'number') return;
        const unknown = dimSymbols(d).filter((s) => !e.hasSymbol(s));
        if (unknown.length !== 1) return;
        const s = unknown[0]!;
        const terms = d.terms.filter((t) => t.vars.includes(s));
        if (terms.length !== 1 || terms[0]!.vars.length !== 1) return;
        const coef = terms[0]!.coef;
        const rest = dimSub(d, { terms: [{ vars: [s], coef }], constant: 0 });
        const size = e.prologueLet(`tensor.dim ${a.ssa}, ${e.index(axis)} : ${tensorTypeOf(a.type)}`);
        const diff = `arith.subi ${size}, ${e.dim(rest)} : index`;
        e.bindSymbolTo(s, coef === 1 ? e.prologueDef(s, diff) : e.prologueDef(s, `arith.divsi ${e.prologueLet(diff)}, ${e.index(coef)} : index`));
        progress = true;
      });
    }
  }
}

/**
 * Lowers a graph (typically a residual after specialization) to one `func.func` in the func,
 * arith, math, linalg, tensor and scf dialects of MLIR 19. Inputs become arguments; parameters
 * with a value in `constants` become `dense<…>` literals (≤ `inlineLimit` elements) or, when
 * larger, arguments (`constants: 'args'`) or `dense_resource` blobs; parameters without a value
 * stay arguments. Symbolic dims are `?`, computed at run time from the arguments' `tensor.dim`s.
 *
 * Errors: the graph must verify (`IR_*`); an op without a lowering is `LOWER_UNSUPPORTED_OP` naming
 * the op and the reason; a constant of the wrong type `LOWER_BAD_CONSTANT`; a symbol no argument
 * determines `LOWER_UNBOUND_DIM`; bad options `LOWER_BAD_OPTIONS`.
 */
export function lowerFunction(graph: Graph, constants: Readonly<Record<string, HostTensor>> = {}, opts: MlirLowerOptions = {}): MlirFunction {
  const { inlineLimit, mode } = checkOptions(opts);
  verifyGraph(graph);
  const fname = symbolName(opts.functionName ?? graph.name);
  const e = new FunctionEmitter(graph.name);
  const args: (MlirArgument & { ssa: string })[] = [];
  const resources: MlirResource[] = [];
  const resourceKeys = new Set<string>();
  const env = new Map<number, ValueRef>();
  const addArg = (name: string, kind: MlirArgument['kind'], type: TensorType, value?: HostTensor): ValueRef => {
    const ssa = e.fresh(name);
    args.push({ name, kind, type, mlirType: tensorTypeOf(type), ssa, ...(value === undefined ? {} : { value }) });
    return { ssa, type };
  };
  const literal = (value: HostTensor, name: string): ValueRef => {
    const type: TensorType = { dtype: value.dtype, shape: value.shape };
    // NOTE: splats (every scalar among them) are always literals: `dense<v>` has constant size, and
    // MLIR 19's finalize-memref-to-llvm crashes on a rank-0 `dense_resource` global. Bool tensors
    // have no portable blob layout (i1 packing differs by consumer), so they stay literals too.
    if (value.data.length <= inlineLimit || isSplat(value) || (mode === 'resources' && value.dtype === 'bool')) return { ssa: e.def(name, `arith.constant ${denseAttr(value)}`), type };
    if (mode === 'args') return addArg(name, 'constant', type, value);
    const base = `${fname}.${name}`.replace(/[^A-Za-z0-9_]/g, '_');
    let key = base;
    for (let k = 1; resourceKeys.has(key); k++) key = `${base}_${String(k)}`;
    resourceKeys.add(key);
    resources.push({ key, value });
    return { ssa: e.def(name, `arith.constant dense_resource<${key}> : ${tensorTypeOf(type)}`), type };
  };
  graph.nodes.forEach((n) => {
    const vid = n.results[0]!;
    const type = graph.values[vid]!.type;
    if (n.kind === 'input') env.set(vid, addArg(n.name, 'input', type));
    else if (n.kind === 'param' && !Object.hasOwn(constants, n.name)) env.set(vid, addArg(n.name, 'param', type));
  });
  bindSymbols(e, args.map((a) => ({ ssa: a.ssa, type: a.type })));
  graph.nodes.forEach((n, i) => {
    if (n.kind === 'input') return;
    if (n.kind === 'param') {
      if (env.has(n.results[0]!)) return;
      const t = constants[n.name]!;
      checkConstant(graph, n.name, graph.values[n.results[0]!]!.type, t);
      env.set(n.results[0]!, literal(t, n.name));
      return;
    }
    const rule = mlirRuleOf(n.op);
    const first = graph.values[n.results[0]!]!.name;
    if (isUnsupported(rule)) {
      throw new LowerError(LowerCode.UNSUPPORTED_OP, `cannot lower ${opDef(n.op).name} (%${first}) to MLIR: ${rule.reason}`, { at: { graph: graph.name, node: i, value: first } });
    }
    const ctx: RuleContext<OpKey> = {
      e,
      attrs: n.attrs,
      operands: n.operands.map((v) => env.get(v)!),
      results: n.results.map((r) => graph.values[r]!.type),
      names: n.results.map((r) => graph.values[r]!.name),
      literal,
    };
    const out = rule(ctx);
    n.results.forEach((r, k) => env.set(r, out[k]!));
  });
  const results = graph.outputs.map((o) => {
    const type = graph.values[o.value]!.type;
    return { name: o.name, type, mlirType: tensorTypeOf(type), ssa: env.get(o.value)!.ssa };
  });
  const sig = args.map((a) => `${a.ssa}: ${a.mlirType} {stageml.${a.kind} = ${JSON.stringify(a.name)}}`).join(', ');
  const ret = results.map((r) => `${r.mlirType} {stageml.output = ${JSON.stringify(r.name)}}`).join(', ');
  const lines = [
    `  func.func @${fname}(${sig}) -> (${ret}) {`,
    ...e.bodyLines(),
    `    func.return ${results.map((r) => r.ssa).join(', ')} : ${results.map((r) => r.mlirType).join(', ')}`,
    '  }',
  ];
  return {
    name: fname,
    text: lines.join('\n'),
    arguments: args.map((a) => ({ name: a.name, kind: a.kind, type: a.type, mlirType: a.mlirType, ...(a.value === undefined ? {} : { value: a.value }) })),
    results: results.map((r) => ({ name: r.name, type: r.type, mlirType: r.mlirType })),
    resources,
  };
}

/** Prints functions as one module: header comments, `module { … }`, then the resource section. */
export function printModule(functions: readonly MlirFunction[], header: readonly string[] = []): string {
  const blobs = functions.flatMap((f) => f.resources.map((r) => ({ key: r.key, blob: resourceBlob(r.value) })));
  const head = header.map((l) => `// ${l}\n`).join('');
  return `${head}module {\n${functions.map((f) => f.text).join('\n\n')}\n}\n${resourceSection(blobs)}`;
}

/**
 * Lowers a graph to a complete MLIR module (see `lowerFunction` for the conventions and errors).
 * The text starts with comments naming the graph and the verification command.
 */
export function lowerToMlir(graph: Graph, constants: Readonly<Record<string, HostTensor>> = {}, opts: MlirLowerOptions = {}): MlirModule {
  const f = lowerFunction(graph, constants, opts);
  const header = [
    `StageML graph @${graph.name} lowered by @stageml/mlir-lower (func, arith, math, linalg, tensor, scf; MLIR 19).`,
    `Arguments: ${String(f.arguments.filter((a) => a.kind === 'input').length)} inputs, ${String(f.arguments.filter((a) => a.kind !== 'input').length)} parameters; ${String(f.resources.length)} resource blobs.`,
    'Verify: mlir-opt-19 --verify-each FILE -o /dev/null',
  ];
  return { text: printModule([f], header), function: f };
}
