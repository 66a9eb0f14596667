import { type Dim, type DType, type Graph, type HostTensor, type OpNode, type ValueId, allocData, dimSymbols, dimToString, graphInputs, normalizeAxis, rounderFor, typeToString } from '@stageml/ir';
import { RuntimeCode, RuntimeError } from '../errors.js';

/** Instruction codes shared with native/cpu/stageml_cpu.cpp (`enum Op`). */
const OP = {
  COPY: 0,
  TRANSPOSE: 1,
  CAST: 2,
  BINARY: 3,
  UNARY: 4,
  CONCAT: 5,
  GATHER: 6,
  SLICE: 7,
  RMSNORM: 8,
  LINEAR: 9,
  MATMUL: 10,
  QLINEAR: 11,
  ROTARY: 12,
  ATTENTION: 13,
  SOFTMAX: 14,
  RESHAPE: 15,
  GATHER_VIEW: 16,
  BROADCAST: 17,
  LAYERNORM: 18,
  WHERE: 19,
  ATTENTION_KV: 20,
  LORA: 21,
  LORA_LINEAR: 22,
  GROUPED_MATMUL: 23,
  SCATTER_ADD: 24,
  TOPK: 25,
  REDUCE: 26,
  ARGMAX: 27,
  IOTA: 28,
  LORA_Q: 29,
  LINEAR_MULTI: 30,
  QLINEAR_MULTI: 31,
} as const;

const REDUCE: Partial<Record<string, number>> = { sum: 0, mean: 1, max: 2 };

const BINARY: Partial<Record<string, number>> = { add: 0, sub: 1, mul: 2, div: 3, maximum: 4, minimum: 5, pow: 6 };
const UNARY: Partial<Record<string, number>> = { neg: 0, abs: 1, exp: 2, log: 3, sqrt: 4, rsqrt: 5, tanh: 6, sigmoid: 7, silu: 8, sin: 9, cos: 10, gelu: 11 };
const GELU_TANH = 12;
const DTYPE_CODE: Partial<Record<DType, number>> = { f32: 0, i64: 1, u8: 2, bool: 3, i32: 4, i8: 5 };
const ST = { SLOT: 0, INPUT: 1, PARAM: 2, VIEW: 3, OUTPUT: 4 } as const;
/** Ops that take i8 values (the int8 factor tables of `quantizedLoraBank` and its decomposition). */
const I8_OPS: ReadonlySet<string> = new Set(['quantizedLoraBank', 'gather', 'indexSelect', 'cast', 'reshape']);

/** A graph encoded for the native runner. */
export interface NativeProgram {
  readonly ints: Int32Array;
  readonly floats: Float64Array;
  /** Parameter data in program order (pinned by the native side). */
  readonly params: HostTensor['data'][];
  /** Graph input names in program input order. */
  readonly inputs: readonly string[];
  /** Graph outputs in program output order. */
  readonly outputs: readonly { readonly name: string; readonly dtype: DType }[];
  /** Symbol names in the order the runner takes their values. */
  readonly symbols: readonly string[];
  /** Instructions and slots, for reports. */
  readonly stats: { readonly instructions: number; readonly slots: number; readonly views: number };
}

interface Instr {
  op: number;
  a: number[];
  r: number[];
  i: number[];
  f: number[];
}

function unsupported(graph: Graph, what: string): never {
  throw new RuntimeError(RuntimeCode.UNSUPPORTED_OP, `cpu-native cannot run @${graph.name}: ${what}`, { hint: 'run this graph on onnxruntime or the interpreter' });
}

/**
 * Encodes `graph` for the native runner: symbolic shapes as integer polynomials over the graph's
 * symbols, reshapes and scalar-index gathers as views, each op by its own instructions (the serving
 * ops `loraBank` and `quantizedLoraBank` (gathered forms), `loraLinear` and `cachedAttention` as the LORA, LORA_Q, LORA_LINEAR and
 * ATTENTION_KV kernels, which read the slot tables, the factors and the cache in place; no
 * primitive pattern is recognised (sibling linears of one input become one LINEAR_MULTI or
 * QLINEAR_MULTI instruction, `fuseSiblingLinears`); the MoE routing ops `topk`, `groupedMatmul` and `scatterAdd`,
 * the reductions and `iota` as kernels of their own, `indexSelect` as a gather), intermediates
 * in liveness-shared slots (sized per run), every output copied into its own buffer. `params`
 * holds each parameter's data.
 * Errors: an op, dtype or attribute the runner lacks is `RT_UNSUPPORTED_OP` naming it.
 */
export function encodeProgram(graph: Graph, params: ReadonlyMap<string, HostTensor>): NativeProgram {
  const values = graph.values;

  // Symbols and dimension expressions.
  const symbols: string[] = [];
  const symIndex = new Map<string, number>();
  const exprKey = new Map<string, number>();
  const exprInts: number[] = [];
  let nexpr = 0;
  const exprOf = (d: Dim): number => {
    const key = dimToString(d);
    const hit = exprKey.get(key);
    if (hit !== undefined) return hit;
    for (const s of dimSymbols(d)) {
      if (!symIndex.has(s)) {
        symIndex.set(s, symbols.length);
        symbols.push(s);
      }
    }
    if (typeof d === 'number') exprInts.push(d, 0);
    else {
      exprInts.push(d.constant, d.terms.length);
      for (const t of d.terms) exprInts.push(t.coef, t.vars.length, ...t.vars.map((v) => symIndex.get(v)!));
    }
    exprKey.set(key, nexpr);
    return nexpr++;
  };
  for (const d of [...values.flatMap((v) => v.type.shape)]) {
    if (typeof d === 'number' && (!Number.isSafeInteger(d) || d > 0x7fffffff)) unsupported(graph, `dimension ${String(d)} is beyond 32 bits`);
  }

  // Value table: graph values first, then one output buffer per graph output.
  interface V {
    dtype: number;
    dims: number[];
    storage: number;
    index: number;
  }
  const table: V[] = values.map((v) => {
    const code = DTYPE_CODE[v.type.dtype];
    if (code === undefined) unsupported(graph, `value %${v.name} is ${typeToString(v.type)} (cpu-native runs f32, i64, i32, u8, i8 and bool values)`);
    return { dtype: code, dims: v.type.shape.map(exprOf), storage: ST.SLOT, index: -1 };
  });
  const inputs = graphInputs(graph).map((n) => n.name);
  const paramData: HostTensor['data'][] = [];
  for (const n of graph.nodes) {
    if (n.kind === 'input') {
      const v = table[n.results[0]!]!;
      v.storage = ST.INPUT;
      v.index = inputs.indexOf(n.name);
    } else if (n.kind === 'param') {
      const t = params.get(n.name);
      if (t === undefined) throw new RuntimeError(RuntimeCode.MISSING_WEIGHT, `parameter '${n.name}' has no data`);
      const v = table[n.results[0]!]!;
      v.storage = ST.PARAM;
      v.index = paramData.length;
      paramData.push(t.data);
    }
  }

  const code: Instr[] = [];
  const floats: number[] = [];
  const fl = (x: number): number => (floats.push(x), floats.length - 1);
  const dtypeOf = (v: ValueId): DType => values[v]!.type.dtype;
  const shapeOf = (v: ValueId): readonly Dim[] => values[v]!.type.shape;
  const need = (n: OpNode, ok: boolean, what: string): void => {
    if (!ok) unsupported(graph, `${n.op} (%${values[n.results[0]!]!.name}) ${what}`);
  };
  const allF32 = (n: OpNode): void => {
    need(n, [...n.operands, ...n.results].every((v) => dtypeOf(v) === 'f32'), 'needs f32 operands');
  };

  // A value of the program that no graph value names (a fused op's intermediate), typed as `like`.
  const temp = (like: ValueId): number => {
    table.push({ dtype: table[like]!.dtype, dims: table[like]!.dims, storage: ST.SLOT, index: -1 });
    return table.length - 1;
  };
  /** Whether two values have one shape (the same dimension expressions, so equal in every run). */
  const sameShape = (u: number, v: number): boolean => table[u]!.dims.join(',') === table[v]!.dims.join(',');
  const attentionFlags = (n: OpNode): [number[], number[]] => {
    const scale = n.attrs['scale'] as number | undefined;
    return [[n.attrs['causal'] === true ? 1 : 0, scale === undefined ? 0 : 1], scale === undefined ? [] : [fl(scale)]];
  };

  const constant = (n: OpNode): void => {
    const r = n.results[0]!;
    const dtype = dtypeOf(r);
    const shape = shapeOf(r) as number[];
    const count = shape.reduce((a, b) => a * b, 1);
    const value = n.attrs['value'] as readonly number[];
    const data = allocData(dtype, count);
    const round = rounderFor(dtype);
    for (let i = 0; i < count; i++) data[i] = round(value.length === 1 ? value[0]! : value[i]!);
    const v = table[r]!;
    v.storage = ST.PARAM;
    v.index = paramData.length;
    paramData.push(data);
  };

  for (const n of graph.nodes) {
    if (n.kind !== 'op') continue;
    const a = [...n.operands];
    const r = [...n.results];
    const x0 = a[0]!;
    const y0 = r[0]!;
    const at = n.attrs;
    const emit = (op: number, i: number[] = [], f: number[] = [], operands = a): void => void code.push({ op, a: operands, r, i, f });
    // i8 values are the int8 factor tables: read by LORA_Q, or gathered, viewed and cast to f32 by
    // the decomposed bank forms; no other kernel takes them.
    need(n, I8_OPS.has(n.op) || ![...a, ...r].some((v) => dtypeOf(v) === 'i8'), `runs i8 values only in ${[...I8_OPS].join(', ')}`);
    const bin = BINARY[n.op];
    const un = UNARY[n.op];
    if (bin !== undefined) {
      const dt = dtypeOf(y0);
      need(n, (dt === 'f32' || dt === 'i64' || dt === 'i32' || dt === 'u8') && a.every((v) => dtypeOf(v) === dt), 'runs on f32, i64, i32 or u8 operands of one dtype');
      emit(OP.BINARY, [bin]);
      continue;
    }
    if (un !== undefined) {
      const dt = dtypeOf(y0);
      need(n, dt === 'f32' || ((dt === 'i64' || dt === 'i32') && (n.op === 'neg' || n.op === 'abs')), 'runs on f32 (neg, abs also on i64 and i32)');
      emit(OP.UNARY, [n.op === 'gelu' && at['approximate'] === 'tanh' ? GELU_TANH : un]);
      continue;
    }
    // eslint-disable-next-line @typescript-eslint/switch-exhaustiveness-check -- the elementwise ops are handled above; the rest is refused by name in `default`
    switch (n.op) {
      case 'constant':
        constant(n);
        break;
      case 'reshape':
        table[y0]!.storage = ST.VIEW;
        table[y0]!.index = x0;
        emit(OP.RESHAPE);
        break;
      case 'transpose': {
        const perm = (at['perm'] as readonly number[]).map((p) => normalizeAxis(p, shapeOf(x0).length));
        emit(OP.TRANSPOSE, perm);
        break;
      }
      case 'broadcastTo':
        emit(OP.BROADCAST);
        break;
      case 'cast':
        emit(OP.CAST);
        break;
      case 'concat':
        need(n, a.length > 0, 'needs operands');
        emit(OP.CONCAT, [normalizeAxis(Number(at['axis']), shapeOf(y0).length)]);
        break;
      case 'gather': {
        const axis = normalizeAxis(Number(at['axis'] ?? 0), shapeOf(x0).length);
        if (axis === 0 && shapeOf(a[1]!).length === 0) {
          table[y0]!.storage = ST.VIEW;
          table[y0]!.index = x0;
          emit(OP.GATHER_VIEW);
        } else emit(OP.GATHER, [axis]);
        break;
      }
      case 'slice': {
        const axis = normalizeAxis(Number(at['axis']), shapeOf(x0).length);
        const end = at['end'] as Dim | undefined;
        emit(OP.SLICE, [axis, exprOf((at['start'] as Dim | undefined) ?? 0), end === undefined ? 0 : 1, end === undefined ? 0 : exprOf(end), Number(at['step'] ?? 1)]);
        break;
      }
      case 'rmsNorm':
      case 'layerNorm':
        allF32(n);
        emit(n.op === 'rmsNorm' ? OP.RMSNORM : OP.LAYERNORM, [a[1] ?? -1, a[2] ?? -1], [fl(Number(at['eps'] ?? (n.op === 'rmsNorm' ? 1e-6 : 1e-5)))]);
        break;
      case 'softmax':
        allF32(n);
        emit(OP.SOFTMAX, [normalizeAxis(Number(at['axis'] ?? -1), shapeOf(x0).length)]);
        break;
      case 'where':
        need(n, dtypeOf(x0) === 'bool', 'needs a bool condition');
        emit(OP.WHERE);
        break;
      case 'linear':
        allF32(n);
        emit(OP.LINEAR);
        break;
      case 'matmul': {
        const dt = dtypeOf(y0);
        need(n, (dt === 'f32' || dt === 'i64' || dt === 'i32') && a.every((v) => dtypeOf(v) === dt), 'runs on f32, i64 or i32 operands of one dtype');
        emit(OP.MATMUL, [at['transposeA'] === true ? 1 : 0, at['transposeB'] === true ? 1 : 0]);
        break;
      }
      case 'loraLinear':
        // x·Wᵀ + s·(x·Aᵀ)·Bᵀ as one instruction (prepare expands non-f32 ones: CPU_NATIVE_RULES).
        allF32(n);
        emit(OP.LORA_LINEAR, [], [fl(at['scale'] as number)]);
        break;
      case 'loraBank': {
        // The gathered form (the executor expands the others): y = base + (x · A[idx]ᵀ) · B[idx],
        // one LORA instruction streaming each row's factors from the slot tables in place, then the add.
        need(n, at['form'] === 'gathered', 'runs the gathered form (the others are expanded at prepare)');
        const [x, base, A, B, idx] = a as [ValueId, ValueId, ValueId, ValueId, ValueId];
        need(n, [x, base, A, B, y0].every((v) => dtypeOf(v) === 'f32') && dtypeOf(idx) === 'i64', 'needs f32 x, base and tables and an i64 index');
        // i[0]: the zeroTail promise (stop reading a slot at its first all-zero A row). A base of
        // the result's shape joins the instruction (each output row starts as its base row: no
        // [B, T, N] temporary, no add pass); a broadcast one is added after.
        if (sameShape(base, y0)) code.push({ op: OP.LORA, a: [x, A, B, idx, base], r, i: [at['zeroTail'] === true ? 1 : 0], f: [] });
        else {
          const delta = temp(y0);
          code.push({ op: OP.LORA, a: [x, A, B, idx], r: [delta], i: [at['zeroTail'] === true ? 1 : 0], f: [] });
          code.push({ op: OP.BINARY, a: [base, delta], r, i: [BINARY['add']!], f: [] });
        }
        break;
      }
      case 'quantizedLoraBank': {
        // The gathered form over int8 tables (the executor expands the others): one LORA_Q
        // instruction reading each group's codes and row scales in place, then the add.
        need(n, at['form'] === 'gathered', 'runs the gathered form (the others are expanded at prepare)');
        const [x, base, A, aScale, B, bScale, idx] = a as [ValueId, ValueId, ValueId, ValueId, ValueId, ValueId, ValueId];
        need(n, [x, base, aScale, bScale, y0].every((v) => dtypeOf(v) === 'f32') && dtypeOf(A) === 'i8' && dtypeOf(B) === 'i8' && dtypeOf(idx) === 'i64', 'needs f32 x, base and scales, i8 tables and an i64 index');
        if (sameShape(base, y0)) code.push({ op: OP.LORA_Q, a: [x, A, aScale, B, bScale, idx, base], r, i: [at['zeroTail'] === true ? 1 : 0], f: [] });
        else {
          const delta = temp(y0);
          code.push({ op: OP.LORA_Q, a: [x, A, aScale, B, bScale, idx], r: [delta], i: [at['zeroTail'] === true ? 1 : 0], f: [] });
          code.push({ op: OP.BINARY, a: [base, delta], r, i: [BINARY['add']!], f: [] });
        }
        break;
      }
      case 'quantizedLinear': {
        need(n, dtypeOf(x0) === 'f32', 'needs f32 activations');
        const out = shapeOf(a[1]!)[0];
        need(n, typeof out === 'number', 'needs a static output size');
        need(n, a.slice(1).every((v) => table[v]!.storage === ST.PARAM), 'needs its codes, scales and zero points as parameters');
        emit(OP.QLINEAR, [Number(at['bits'] ?? 8), Number(at['blockSize']), Number(at['inFeatures']), out as number]);
        break;
      }
      case 'rotary':
        allF32(n);
        emit(OP.ROTARY, [at['interleaved'] === true ? 1 : 0]);
        break;
      case 'attention': {
        need(n, a.slice(0, 3).every((v) => dtypeOf(v) === 'f32') && dtypeOf(y0) === 'f32', 'needs f32 q, k, v');
        need(n, a[3] === undefined || dtypeOf(a[3]) === 'f32' || dtypeOf(a[3]) === 'bool', 'needs an f32 or bool mask');
        emit(OP.ATTENTION, ...attentionFlags(n));
        break;
      }
      case 'cachedAttention': {
        // Keys and values in two segments each, read in place: the position-major cache
        // [B, past, H, D] (layout 1) and the step's head-major k/v [B, H, seq, D] (layout 0).
        need(n, a.slice(0, 5).every((v) => dtypeOf(v) === 'f32') && dtypeOf(y0) === 'f32', 'needs f32 q, caches, k and v');
        need(n, a[5] === undefined || dtypeOf(a[5]) === 'f32' || dtypeOf(a[5]) === 'bool', 'needs an f32 or bool mask');
        need(n, shapeOf(x0).length === 4, 'runs rank-4 q (others are expanded at prepare)');
        const [q, pastK, pastV, k, v] = a as [ValueId, ValueId, ValueId, ValueId, ValueId];
        const [flags, sc] = attentionFlags(n);
        emit(OP.ATTENTION_KV, [...flags, 1, 0, 1, 0], sc, [q, pastK, k, pastV, v, ...a.slice(5)]);
        break;
      }
      case 'groupedMatmul': {
        const dt = dtypeOf(y0);
        need(n, (dt === 'f32' || dt === 'i64' || dt === 'i32') && dtypeOf(a[1]!) === dt, 'runs on f32, i64 or i32 operands of one dtype');
        emit(OP.GROUPED_MATMUL, [at['transposeW'] === true ? 1 : 0]);
        break;
      }
      case 'indexSelect':
        // A 1-D index: the gather kernel's layout exactly (y = x[…, index[j], …]).
        emit(OP.GATHER, [normalizeAxis(Number(at['axis'] ?? 0), shapeOf(x0).length)]);
        break;
      case 'scatterAdd':
        emit(OP.SCATTER_ADD, [normalizeAxis(Number(at['axis'] ?? 0), shapeOf(x0).length)]);
        break;
      case 'topk':
        emit(OP.TOPK, [Number(at['k']), normalizeAxis(Number(at['axis'] ?? -1), shapeOf(x0).length), at['largest'] === false ? 0 : 1]);
        break;
      case 'sum':
      case 'mean':
      case 'max': {
        const rank = shapeOf(x0).length;
        const axes = [...new Set(((at['axes'] as readonly number[] | undefined) ?? []).map((ax) => normalizeAxis(ax, rank)))];
        emit(OP.REDUCE, [REDUCE[n.op]!, ...axes]);
        break;
      }
      case 'argmax':
        emit(OP.ARGMAX, [normalizeAxis(Number(at['axis'] ?? -1), shapeOf(x0).length)]);
        break;
      case 'iota':
        emit(OP.IOTA, [normalizeAxis(Number(at['axis'] ?? 0), shapeOf(y0).length)]);
        break;
      default:
        unsupported(graph, `op ${n.op} (%${values[y0]!.name}) is not in the native runner`);
    }
  }

  // Outputs: each copied into its own buffer.
  const outputs = graph.outputs.map((o, k) => {
    const src = table[o.value]!;
    const id = table.length;
    table.push({ dtype: src.dtype, dims: src.dims, storage: ST.OUTPUT, index: k });
    code.push({ op: OP.COPY, a: [o.value], r: [id], i: [], f: [] });
    return { name: o.name, dtype: dtypeOf(o.value) };
  });

  // Dead code: instructions none of whose results is read are dropped.
  {
    const live = new Set<number>(code.filter((c) => c.op === OP.COPY && table[c.r[0]!]!.storage === ST.OUTPUT).flatMap((c) => c.r));
    const keep = new Array<boolean>(code.length).fill(false);
    for (let k = code.length - 1; k >= 0; k--) {
      const ins = code[k]!;
      if (!ins.r.some((v) => live.has(v))) continue;
      keep[k] = true;
      for (const v of ins.a) live.add(v);
    }
    const kept = code.filter((_, k) => keep[k]);
    code.length = 0;
    code.push(...kept);
  }

  // Gather views of an input or parameter at an input index (the single slot form's factors: one
  // slot's rows of a table) only set a pointer, from values that exist from the start: they run
  // first, so a linear reading one as its weight is a sibling like any other (the LoRA shrink x·Aᵀ
  // joins the base projections of x in one LINEAR_MULTI: at a batch-1 step one pool job instead
  // of the shrink's own instruction, 7 a layer).
  const isSource = (v: number): boolean => table[v]!.storage === ST.INPUT || table[v]!.storage === ST.PARAM;
  const early = code.filter((ins) => ins.op === OP.GATHER_VIEW && ins.a.every(isSource));
  if (early.length > 0) {
    const moved = new Set(early);
    const rest = code.filter((ins) => !moved.has(ins));
    code.length = 0;
    code.push(...early, ...rest);
  }
  const earlyViews = new Set(early.flatMap((ins) => ins.r));
  fuseSiblingLinears(code, (v) => isSource(v) || earlyViews.has(v));

  // Liveness over instructions; views extend their root's lifetime.
  const rootOf = (v: number): number => {
    let x = v;
    while (table[x]!.storage === ST.VIEW) x = table[x]!.index;
    return x;
  };
  const lastUse = new Array<number>(table.length).fill(-1);
  code.forEach((ins, k) => {
    for (const v of ins.a) lastUse[rootOf(v)] = Math.max(lastUse[rootOf(v)]!, k);
    for (const v of ins.r) lastUse[rootOf(v)] = Math.max(lastUse[rootOf(v)]!, k);
  });
  // Slots: a freed slot is reused first by a value of the same size expression.
  const sizeKey = (v: number): string => `${String(table[v]!.dtype)}:${table[v]!.dims.join(',')}`;
  const free = new Map<string, number[]>();
  const anyFree: number[] = [];
  let slots = 0;
  const slotSizes = new Map<number, string>();
  const freedAt = new Map<number, number[]>();
  code.forEach((ins, k) => {
    for (const v of ins.r) {
      const t = table[v]!;
      if (t.storage !== ST.SLOT || t.index >= 0) continue;
      const key = sizeKey(v);
      let s = free.get(key)?.pop();
      if (s !== undefined) anyFree.splice(anyFree.indexOf(s), 1);
      else {
        s = anyFree.shift();
        if (s !== undefined) {
          const list = free.get(slotSizes.get(s)!);
          list?.splice(list.indexOf(s), 1);
        }
      }
      s ??= slots++;
      t.index = s;
      slotSizes.set(s, key);
      const end = Math.max(lastUse[v]!, k);
      let l = freedAt.get(end);
      if (l === undefined) freedAt.set(end, (l = []));
      l.push(s);
    }
    for (const s of freedAt.get(k) ?? []) {
      const key = slotSizes.get(s)!;
      let l = free.get(key);
      if (l === undefined) free.set(key, (l = []));
      l.push(s);
      anyFree.push(s);
    }
  });
  // Values never produced by an instruction nor stored elsewhere (dead, unreachable) get a slot
  // of their own so every value has storage.
  for (const t of table) if (t.storage === ST.SLOT && t.index < 0) t.index = slots++;

  const ints: number[] = [1, symbols.length, nexpr, table.length, code.length, slots, inputs.length, outputs.length, paramData.length];
  ints.push(...exprInts);
  for (const t of table) ints.push(t.dtype, t.dims.length, ...t.dims, t.storage, t.index);
  for (const ins of code) ints.push(ins.op, ins.a.length, ...ins.a, ins.r.length, ...ins.r, ins.i.length, ...ins.i, ins.f.length, ...ins.f);
  for (const x of ints) if (!Number.isSafeInteger(x) || x > 0x7fffffff || x < -0x80000000) unsupported(graph, `a constant ${String(x)} is beyond 32 bits`);
  return {
    ints: Int32Array.from(ints),
    floats: Float64Array.from(floats),
    params: paramData,
    inputs,
    outputs,
    symbols,
    stats: { instructions: code.length, slots, views: table.filter((t) => t.storage === ST.VIEW).length },
  };
}

/**
 * Sibling linears — LINEAR (no bias) or QLINEAR instructions that read one input x, such as a
 * layer's q, k and v projections or its gate and up projections — become one LINEAR_MULTI or
 * QLINEAR_MULTI instruction at the first one's place (the runner sends every sibling's output
 * tiles to its pool as one job, f32 ones at a few rows and quantized ones at every row count: one
 * barrier instead of one per weight, and one quantization of x for a quantized group). The later
 * siblings move up, which is safe because they read only x, which the first one reads too, and
 * weights that `ready` says exist from the start (inputs, parameters, and gather views of them
 * that run before every other instruction); slots are assigned after
 * this, so no value's storage is shared across the move. Quantized siblings fuse when their bits,
 * block size, input size and zero-point rule agree (the runner quantizes x once for all of them).
 * Rewrites `code` in place.
 */
function fuseSiblingLinears(code: Instr[], ready: (v: number) => boolean): void {
  const keyOf = (ins: Instr): string | undefined => {
    if (ins.op === OP.LINEAR) return ins.a.length === 2 && ready(ins.a[1]!) ? `f ${String(ins.a[0])}` : undefined;
    if (ins.op === OP.QLINEAR) return `q ${String(ins.a[0])} ${ins.i.slice(0, 3).join(' ')} ${String(ins.a.length)}`;
    return undefined;
  };
  const groups = new Map<string, number[]>();
  code.forEach((ins, k) => {
    const key = keyOf(ins);
    if (key === undefined) return;
    const g = groups.get(key);
    if (g === undefined) groups.set(key, [k]);
    else g.push(k);
  });
  const fused = new Map<number, Instr>();
  const moved = new Set<number>();
  for (const ks of groups.values()) {
    if (ks.length < 2) continue;
    const members = ks.map((k) => code[k]!);
    const first = members[0]!;
    const r = members.flatMap((m) => m.r);
    if (first.op === OP.LINEAR) fused.set(ks[0]!, { op: OP.LINEAR_MULTI, a: [first.a[0]!, ...members.map((m) => m.a[1]!)], r, i: [], f: [] });
    else fused.set(ks[0]!, { op: OP.QLINEAR_MULTI, a: [first.a[0]!, ...members.flatMap((m) => m.a.slice(1))], r, i: [...first.i.slice(0, 3), first.a.length === 4 ? 1 : 0, ...members.map((m) => m.i[3]!)], f: [] });
    for (const k of ks.slice(1)) moved.add(k);
  }
  if (fused.size === 0) return;
  const out = code.flatMap((ins, k) => (moved.has(k) ? [] : [fused.get(k) ?? ins]));
  code.length = 0;
  code.push(...out);
}
