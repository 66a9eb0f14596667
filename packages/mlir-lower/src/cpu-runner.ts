import { type DType, type HostTensor, allocData, f16FromBits, sizeOf, errorMessage } from '@stageml/ir';
import { LowerCode, LowerError } from './errors.js';
import { denseAttr } from './literals.js';
import { type MlirFunction, type MlirResource, printModule } from './lower.js';
import { type MlirTools, executeOnCpu, verifyMlir } from './toolchain.js';
import { f32FromBits, f64FromBits, tensorTypeOf } from './types.js';

/** One call for the CPU runner: a lowered function and the tensors for its arguments. */
export interface RunnerCall {
  readonly fn: MlirFunction;
  /** Values of `input` and `param` arguments, by IR name (`constant` arguments carry their own). */
  readonly values: Readonly<Record<string, HostTensor>>;
}

/** Result of `runMlirOnCpu`: each call's outputs by name, or where and why it failed. */
export type CpuRunResult =
  | { readonly status: 'ok'; readonly outputs: readonly Readonly<Record<string, HostTensor>>[] }
  | { readonly status: 'error'; readonly stage: 'verify' | 'run' | 'parse'; readonly diagnostics: string };

/** Literals in `@main` above this many elements are resource blobs (they parse far faster). */
const MAIN_INLINE_LIMIT = 256;

/** How each printed memref maps back to an output: its dtype (the printed integers are bit patterns). */
interface Printed {
  readonly call: number;
  readonly name: string;
  readonly dtype: DType;
}

/** Printable integer type and the conversion to it (floats are bitcast so values come back exactly). */
function printable(dtype: DType): { readonly to: 'i32' | 'i64'; readonly ops: readonly ((from: string, to: string) => string)[] } {
  switch (dtype) {
    case 'f32':
      return { to: 'i32', ops: [(f, t) => `arith.bitcast ${f} to ${t}`] };
    case 'f64':
      return { to: 'i64', ops: [(f, t) => `arith.bitcast ${f} to ${t}`] };
    case 'f16':
    case 'bf16':
      return { to: 'i32', ops: [(f, t) => `arith.bitcast ${f} to ${t}`, (f, t) => `arith.extui ${f} to ${t}`] };
    case 'i64':
      return { to: 'i64', ops: [] };
    case 'i32':
      return { to: 'i32', ops: [] };
    case 'i8':
      return { to: 'i32', ops: [(f, t) => `arith.extsi ${f} to ${t}`] };
    case 'u8':
    case 'bool':
      return { to: 'i32', ops: [(f, t) => `arith.extui ${f} to ${t}`] };
  }
}

/** `tensor<?x4xf32>` with another element type (`tensor<?x4xi32>`). */
function withElement(mlirType: string, elem: string): string {
  const cut = Math.max(mlirType.lastIndexOf('x'), mlirType.indexOf('<'));
  return `${mlirType.slice(0, cut + 1)}${elem}>`;
}

/**
 * A module holding the calls' functions and a `@main` that builds every argument from literals
 * (static shapes, cast to the function's `?` dims), calls each function, and prints each output
 * with `printMemrefI32`/`printMemrefI64` (floats as their bit patterns).
 */
export function buildRunnerModule(calls: readonly RunnerCall[]): { readonly text: string; readonly printed: readonly Printed[] } {
  const lines: string[] = ['  func.func @main() {'];
  const printed: Printed[] = [];
  const resources: MlirResource[] = [];
  let n = 0;
  const v = (): string => `%m${String(n++)}`;
  calls.forEach((call, ci) => {
    const args = call.fn.arguments.map((a) => {
      const t = a.kind === 'constant' ? a.value : call.values[a.name];
      if (t === undefined) throw new LowerError(LowerCode.BAD_OPTIONS, `no value for argument '${a.name}' of @${call.fn.name}`);
      const lit = v();
      const staticType = tensorTypeOf({ dtype: t.dtype, shape: t.shape });
      if (t.data.length > MAIN_INLINE_LIMIT && t.dtype !== 'bool') {
        const key = `main_arg_${String(resources.length)}`;
        resources.push({ key, value: t });
        lines.push(`    ${lit} = arith.constant dense_resource<${key}> : ${staticType}`);
      } else lines.push(`    ${lit} = arith.constant ${denseAttr(t)}`);
      if (staticType === a.mlirType) return lit;
      const cast = v();
      lines.push(`    ${cast} = tensor.cast ${lit} : ${staticType} to ${a.mlirType}`);
      return cast;
    });
    const res = v();
    const types = call.fn.results.map((r) => r.mlirType);
    const multi = types.length > 1 ? `:${String(types.length)}` : '';
    lines.push(`    ${res}${multi} = func.call @${call.fn.name}(${args.join(', ')}) : (${call.fn.arguments.map((a) => a.mlirType).join(', ')}) -> (${types.join(', ')})`);
    call.fn.results.forEach((r, k) => {
      let cur = types.length > 1 ? `${res}#${String(k)}` : res;
      let curType = r.mlirType;
      const p = printable(r.type.dtype);
      for (const op of p.ops) {
        const next = v();
        const nextType = withElement(r.mlirType, op === p.ops[p.ops.length - 1] ? p.to : 'i16');
        lines.push(`    ${next} = ${op(`${cur} : ${curType}`, nextType)}`);
        cur = next;
        curType = nextType;
      }
      const mem = v();
      const unranked = v();
      lines.push(`    ${mem} = bufferization.to_memref ${cur} : ${curType.replace('tensor<', 'memref<')}`);
      lines.push(`    ${unranked} = memref.cast ${mem} : ${curType.replace('tensor<', 'memref<')} to memref<*x${p.to}>`);
      lines.push(`    func.call @printMemref${p.to.toUpperCase()}(${unranked}) : (memref<*x${p.to}>) -> ()`);
      printed.push({ call: ci, name: r.name, dtype: r.type.dtype });
    });
  });
  lines.push('    func.return', '  }');
  lines.push('  func.func private @printMemrefI32(memref<*xi32>) attributes {llvm.emit_c_interface}');
  lines.push('  func.func private @printMemrefI64(memref<*xi64>) attributes {llvm.emit_c_interface}');
  const main: MlirFunction = { name: 'main', text: lines.join('\n'), arguments: [], results: [], resources };
  return { text: printModule([...calls.map((c) => c.fn), main]), printed };
}

function decode(dtype: DType, shape: number[], ints: readonly bigint[]): HostTensor {
  const data = allocData(dtype, ints.length);
  ints.forEach((b, i) => {
    switch (dtype) {
      case 'f32':
        data[i] = f32FromBits(Number(BigInt.asUintN(32, b)));
        break;
      case 'f64':
        data[i] = f64FromBits(b);
        break;
      case 'f16':
        data[i] = f16FromBits(Number(b));
        break;
      case 'bf16':
        data[i] = f32FromBits(Number(b) << 16);
        break;
      case 'i64':
      case 'i32':
      case 'i8':
      case 'u8':
      case 'bool':
        data[i] = Number(b);
    }
  });
  return { dtype, shape, data };
}

/** Parses the runner's `printMemref*` output back into tensors, in print order. */
export function parseRunnerOutput(stdout: string, printed: readonly Printed[]): HostTensor[] {
  const blocks = stdout.split('Unranked Memref').slice(1);
  if (blocks.length !== printed.length) {
    throw new LowerError(LowerCode.TOOL_FAILED, `mlir-cpu-runner printed ${String(blocks.length)} memrefs, expected ${String(printed.length)}`);
  }
  return blocks.map((block, i) => {
    const sizes = /sizes = \[([^\]]*)\]/.exec(block)?.[1] ?? '';
    const shape = sizes.trim() === '' ? [] : sizes.split(',').map((s) => Number(s.trim()));
    const data = block.slice(block.indexOf('data =') + 'data ='.length);
    // NOTE: printMemref prints one (meaningless) element for an empty memref.
    const ints = sizeOf(shape) === 0 ? [] : (data.match(/-?\d+/g) ?? []).map((s) => BigInt(s));
    if (ints.length !== sizeOf(shape)) throw new LowerError(LowerCode.TOOL_FAILED, `output '${printed[i]!.name}': ${String(ints.length)} values for shape [${shape.join(', ')}]`);
    return decode(printed[i]!.dtype, shape, ints);
  });
}

/**
 * Runs lowered functions on the CPU: builds a `@main` that calls each with the given values
 * (`buildRunnerModule`), lowers it with `LLVM_PIPELINE` under `--verify-each`, executes it with
 * `mlir-cpu-runner` and parses the printed outputs bit-exactly. Batch many calls into one run:
 * every tool start costs far more than these small programs.
 */
export async function runMlirOnCpu(calls: readonly RunnerCall[], tools: MlirTools): Promise<CpuRunResult> {
  const { text, printed } = buildRunnerModule(calls);
  const lowered = await verifyMlir(text, tools, { pipeline: 'llvm' });
  if (!lowered.ok) return { status: 'error', stage: 'verify', diagnostics: lowered.diagnostics };
  const ran = await executeOnCpu(lowered.output, tools);
  if (!ran.ok) return { status: 'error', stage: 'run', diagnostics: ran.diagnostics };
  let tensors: HostTensor[];
  try {
    tensors = parseRunnerOutput(ran.output, printed);
  } catch (e) {
    return { status: 'error', stage: 'parse', diagnostics: errorMessage(e) };
  }
  const outputs: Record<string, HostTensor>[] = calls.map(() => ({}));
  printed.forEach((p, i) => {
    outputs[p.call]![p.name] = tensors[i]!;
  });
  return { status: 'ok', outputs };
}
