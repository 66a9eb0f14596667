import { type Graph, type OpNode, errorMessage } from '@stageml/ir';
import { isOccupied, loadBundle, writeFilesAtomic } from '@stageml/bundle';
import { type ResidualKernel, recognizeResidual } from '@stageml/kernel-patterns';
import { ABI_HEADER } from './cuda-abi.js';
import { GEMM_TEMPLATES } from './cuda-gemm.js';
import { GROUPED_TEMPLATES } from './cuda-grouped.js';
import { type RegistryEntry, type Sm90Kernel, emitCudaUnit } from './emit.js';
import { Sm90Code, Sm90Error } from './errors.js';
import { hostReason } from './rules.js';

/** Options of `generateCuda`. */
export interface CudaOptions {
  /** Fail with `SM90_UNSUPPORTED_OP` when any op is left to the host executor (default false). */
  readonly strict?: boolean;
}

/** An op node the generated kernels do not cover, left to the host executor. */
export interface CudaHostOp {
  readonly node: number;
  readonly op: string;
  readonly value: string;
  readonly reason: string;
}

/** What `generateCuda` produced. */
export interface CudaOutput {
  /** File name → contents: headers, one `.cu` per kernel, `manifest.json`. */
  readonly files: Readonly<Record<string, string>>;
  /** The kernels, in graph order. */
  readonly kernels: readonly Sm90Kernel[];
  /** Registry entries the `.cu` files add, by kernel. */
  readonly entries: readonly RegistryEntry[];
  /** Ops left to the host executor. */
  readonly hostOps: readonly CudaHostOp[];
}

/** Largest rank the kernels' rank tiles take (the expand's epilogue tile is sized by it). */
export const MAX_RANK = 64;

function check(g: Graph, k: ResidualKernel): Sm90Kernel {
  const at = { graph: g.name, value: k.output };
  if (k.dtype !== 'f16' && k.dtype !== 'bf16') {
    throw new Sm90Error(Sm90Code.UNSUPPORTED_DTYPE, `${k.kind} kernel for %${k.output} computes in ${k.dtype}; the tensor-core kernels take f16 or bf16`, {
      at,
      hint: 'use @stageml/triton-gen for f32 kernels (3xTF32 dots)',
    });
  }
  const ranks = k.kind === 'bankGrouped' ? k.groups.map((x) => x.rank) : k.kind === 'bankGathered' ? [k.rank] : k.lora === undefined ? [] : [k.lora.rank];
  for (const [what, d] of [['input dim', k.inDim], ['output dim', k.outDim], ...ranks.map((r) => ['rank', r] as const)] as const) {
    if (d % 8 !== 0) throw new Sm90Error(Sm90Code.BAD_SHAPE, `${what} ${String(d)} of %${k.output} is not a multiple of 8 (16-byte loads)`, { at });
  }
  const bad = (msg: string): never => {
    throw new Sm90Error(Sm90Code.UNSUPPORTED_PATTERN, `%${k.output}: ${msg}`, { at, hint: 'use @stageml/triton-gen for this pattern' });
  };
  if (ranks.some((r) => r > MAX_RANK)) bad(`rank ${String(Math.max(...ranks))} is above ${String(MAX_RANK)}`);
  if (k.kind === 'loraLinear' && k.lora?.biasB !== undefined) bad('LoRA bias of B (lora_bias) is not supported');
  if (k.kind === 'bankGrouped' && k.groups.some((x) => x.biasB !== undefined)) bad('LoRA bias of B (lora_bias) is not supported');
  if (k.kind === 'bankGrouped' && k.bias !== undefined) bad('a bias on the base of a bank is not supported');
  if (k.kind === 'bankGathered' && k.bias !== undefined) bad('a bias on the base of a bank is not supported');
  if (k.kind === 'moeLora' && !k.transposeW) bad('expert weights must be [E, out, in] (transposeW)');
  return k as Sm90Kernel;
}

function at(g: Graph, node: number): { graph: string; node: number; value: string } {
  return { graph: g.name, node, value: g.values[g.nodes[node]!.results[0]!]!.name };
}

/**
 * Generates CUDA C++ for sm_90a from the LoRA, bank and MoE patterns of a residual graph (see
 * `recognizeResidual`): one translation unit per pattern instantiating the tensor-core templates
 * with the pattern's static dims, with checked host launchers registered for native/. A pattern the
 * kernels cannot take (`SM90_UNSUPPORTED_DTYPE`, `SM90_BAD_SHAPE`, `SM90_UNSUPPORTED_PATTERN`) is
 * left to the host executor like any other op, and its error is thrown only under `strict` or when
 * no kernel remains. Also throws `SM90_DYNAMIC_DIM`, `SM90_NO_KERNELS`, and `SM90_UNSUPPORTED_OP`
 * for host ops under `strict`.
 */
export function generateCuda(g: Graph, opts: CudaOptions = {}): CudaOutput {
  const rec = recognizeResidual(g);
  const first = rec.rejected[0];
  if (first !== undefined) throw new Sm90Error(Sm90Code.DYNAMIC_DIM, first.message, { at: at(g, first.node) });
  const hostOps: CudaHostOp[] = [];
  for (const i of rec.uncovered) {
    const n = g.nodes[i] as OpNode;
    const reason = hostReason(n.op);
    if (opts.strict === true) throw new Sm90Error(Sm90Code.UNSUPPORTED_OP, `sml op '${n.op}' has no CUDA kernel: ${reason}`, { at: at(g, i) });
    hostOps.push({ node: i, op: n.op, value: at(g, i).value, reason });
  }
  if (rec.kernels.length === 0) throw new Sm90Error(Sm90Code.NO_KERNELS, `graph @${g.name} holds no linear, LoRA, bank or MoE pattern to generate kernels for`);
  // A pattern the kernels cannot take is left to the host (its ops listed with the reason), unless
  // strict or unless nothing else remains, so one odd router GEMM does not sink a whole MoE bundle.
  const kernels: Sm90Kernel[] = [];
  const refused: Sm90Error[] = [];
  for (const k of rec.kernels) {
    try {
      kernels.push(check(g, k));
    } catch (e) {
      if (!(e instanceof Sm90Error) || opts.strict === true) throw e;
      refused.push(e);
      for (const i of k.nodes) hostOps.push({ node: i, op: (g.nodes[i] as OpNode).op, value: at(g, i).value, reason: `${e.code}: ${e.message}` });
    }
  }
  if (kernels.length === 0) throw refused[0]!;
  hostOps.sort((p, q) => p.node - q.node);
  const files: Record<string, string> = { 'stageml_abi.h': ABI_HEADER, 'stageml_sm90.cuh': `${GEMM_TEMPLATES}${GROUPED_TEMPLATES}` };
  const entries: RegistryEntry[] = [];
  for (const k of kernels) {
    const unit = emitCudaUnit(k);
    files[`${k.name}.cu`] = unit.text;
    entries.push(...unit.entries);
  }
  const manifest = {
    format: 'stageml.sm90',
    version: 1,
    graph: g.name,
    arch: 'sm_90a',
    kernels: kernels.map((k) => ({ ...k, file: `${k.name}.cu` })),
    entries,
    hostOps,
  };
  files['manifest.json'] = `${JSON.stringify(manifest, null, 2)}\n`;
  return { files, kernels, entries, hostOps };
}

/** Options of `writeCudaDir`. */
export interface CudaWriteOptions {
  /** Replace a non-empty directory (default false: its files are not ours to delete; the CLI: --force). */
  readonly overwrite?: boolean;
}

async function refuseOccupied(dir: string, opts: CudaWriteOptions): Promise<void> {
  if (opts.overwrite !== true && (await isOccupied(dir))) {
    throw new Sm90Error(Sm90Code.IO, `output directory '${dir}' exists and is not empty`, { hint: 'pass overwrite: true (the CLI: --force) to replace it' });
  }
}

/**
 * Writes generated files into `dir` atomically (a temporary sibling renamed into place; on failure
 * `dir` is left as it was). A non-empty `dir` is refused unless `overwrite`; `SM90_IO` on failure.
 */
export async function writeCudaDir(dir: string, files: Readonly<Record<string, string>>, opts: CudaWriteOptions = {}): Promise<void> {
  await refuseOccupied(dir, opts);
  try {
    await writeFilesAtomic(dir, files);
  } catch (e) {
    throw new Sm90Error(Sm90Code.IO, `cannot write '${dir}': ${errorMessage(e)}`, { cause: e });
  }
}

/** `stageml gen cuda`: loads a residual bundle, generates, and writes the files into `outDir`. */
export async function generateCudaFromBundle(bundleDir: string, outDir: string, opts: CudaOptions & CudaWriteOptions = {}): Promise<CudaOutput> {
  await refuseOccupied(outDir, opts); // before any work: the files there are not ours
  const bundle = await loadBundle(bundleDir);
  const out = generateCuda(bundle.residual, opts);
  await writeCudaDir(outDir, out.files, opts);
  return out;
}
