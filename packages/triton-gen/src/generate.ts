import { type Graph, type OpNode, errorMessage } from '@stageml/ir';
import { isOccupied, loadBundle, writeFilesAtomic } from '@stageml/bundle';
import { emitCheck } from './emit-check.js';
import { emitCommonModule } from './emit-common.js';
import { emitKernelModule } from './emit-kernels.js';
import { emitLauncher } from './emit-launch.js';
import { TritonCode, TritonError } from './errors.js';
import { type ResidualKernel, recognizeResidual } from './patterns.js';
import { type TritonKernel, isTritonDType, pyHeader } from './python.js';
import { hostReason } from './rules.js';

/** Options of `generateTriton`. */
export interface TritonOptions {
  /** Fail with `TRITON_UNSUPPORTED_OP` when any op is left to the host executor (default false). */
  readonly strict?: boolean;
}

/** An op node the generated kernels do not cover, left to the host executor. */
export interface HostOp {
  /** Node index in the residual. */
  readonly node: number;
  /** Printed op name (`sml.softmax`). */
  readonly op: string;
  /** Value it defines. */
  readonly value: string;
  /** Why the backend leaves it (from the rule table). */
  readonly reason: string;
}

/** What `generateTriton` produced: file texts by relative path, and what they cover. */
export interface TritonOutput {
  /** File name → contents (Python sources and `manifest.json`). */
  readonly files: Readonly<Record<string, string>>;
  /** The kernels, in graph order. */
  readonly kernels: readonly TritonKernel[];
  /** Ops left to the host executor. */
  readonly hostOps: readonly HostOp[];
}

function at(g: Graph, node: number): { graph: string; node: number; value: string } {
  return { graph: g.name, node, value: g.values[g.nodes[node]!.results[0]!]!.name };
}

function narrow(g: Graph, k: ResidualKernel): TritonKernel {
  if (!isTritonDType(k.dtype)) {
    throw new TritonError(TritonCode.UNSUPPORTED_DTYPE, `${k.kind} kernel for %${k.output} computes in ${k.dtype}; Triton kernels take f16, bf16 or f32`, {
      at: { graph: g.name, value: k.output },
      hint: 'cast the layer to f16, bf16 or f32 before staging',
    });
  }
  return k as TritonKernel;
}

function emitCheckAll(kernels: readonly TritonKernel[]): string {
  return `${pyHeader('Runs every check-and-bench script of this directory and prints one table.')}import argparse
import datetime
import importlib
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stageml_triton_common as common  # noqa: E402

KERNELS = [${kernels.map((k) => `"${k.name}"`).join(', ')}]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", default=None, help="write every result row and the run's metadata here")
    ap.add_argument("--kernels", default=None, help="comma-separated subset of KERNELS")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--rows", default=None)
    args = ap.parse_args(argv)
    names = args.kernels.split(",") if args.kernels else KERNELS
    peak = None if args.no_bench else common.copy_gbps(2 << 30)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__, "copy_gbps_peak": peak,
            "launch_floor_ms": None if args.no_bench else common.launch_floor_ms()}
    print(f"# {meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  copy {peak or 0:.0f} GB/s  launch floor {meta['launch_floor_ms'] or 0:.4f} ms")
    rows, failures = [], []
    for name in names:
        check = importlib.import_module(f"{name}_check")
        sub = (["--no-bench"] if args.no_bench else []) + (["--rows", args.rows] if args.rows else [])
        try:
            rows += check.main(sub, peak=peak)
        except Exception as e:  # one broken kernel must not hide the others' results
            failures.append({"kernel": name, "error": f"{type(e).__name__}: {e}"})
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
    common.print_table(rows, importlib.import_module(f"{names[0]}_check").COLUMNS if names else [])
    if args.json:
        common.write_json(args.json, {"meta": meta, "results": rows, "failures": failures})
    return 0 if not failures and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
`;
}

function manifest(g: Graph, kernels: readonly TritonKernel[], hostOps: readonly HostOp[]): string {
  const body = {
    format: 'stageml.triton',
    version: 1,
    graph: g.name,
    kernels: kernels.map((k) => ({ ...k, files: [`${k.name}.py`, `${k.name}_launch.py`, `${k.name}_check.py`] })),
    hostOps,
  };
  return `${JSON.stringify(body, null, 2)}\n`;
}

/**
 * Generates Triton kernels, launchers and check-and-bench scripts for the LoRA, bank and MoE
 * patterns of a residual graph (see `recognizeResidual`). Ops outside every pattern are listed
 * as host ops, or rejected with `TRITON_UNSUPPORTED_OP` under `strict`. Throws
 * `TRITON_DYNAMIC_DIM` for a match whose specialized dims are symbolic and `TRITON_NO_KERNELS`
 * when nothing matches; a pattern in a dtype other than f16/bf16/f32 is left to the host, and
 * `TRITON_UNSUPPORTED_DTYPE` is thrown only under `strict` or when no kernel remains.
 */
export function generateTriton(g: Graph, opts: TritonOptions = {}): TritonOutput {
  const rec = recognizeResidual(g);
  const first = rec.rejected[0];
  if (first !== undefined) {
    throw new TritonError(TritonCode.DYNAMIC_DIM, first.message, { at: at(g, first.node), hint: 'specialize the residual at a cutoff where weights are known' });
  }
  const hostOps: HostOp[] = [];
  for (const i of rec.uncovered) {
    const n = g.nodes[i] as OpNode;
    const reason = hostReason(n.op);
    if (opts.strict === true) throw new TritonError(TritonCode.UNSUPPORTED_OP, `sml op '${n.op}' has no Triton kernel: ${reason}`, { at: at(g, i) });
    hostOps.push({ node: i, op: n.op, value: at(g, i).value, reason });
  }
  if (rec.kernels.length === 0) {
    throw new TritonError(TritonCode.NO_KERNELS, `graph @${g.name} holds no linear, LoRA, bank or MoE pattern to generate kernels for`);
  }
  // A pattern in a dtype the kernels do not take is left to the host (its ops listed with the
  // reason), unless strict or unless nothing else remains.
  const kernels: TritonKernel[] = [];
  const refused: TritonError[] = [];
  for (const k of rec.kernels) {
    try {
      kernels.push(narrow(g, k));
    } catch (e) {
      if (!(e instanceof TritonError) || opts.strict === true) throw e;
      refused.push(e);
      for (const i of k.nodes) hostOps.push({ node: i, op: (g.nodes[i] as OpNode).op, value: at(g, i).value, reason: `${e.code}: ${e.message}` });
    }
  }
  if (kernels.length === 0) throw refused[0]!;
  hostOps.sort((p, q) => p.node - q.node);
  const files: Record<string, string> = { 'stageml_triton_common.py': emitCommonModule() };
  for (const k of kernels) {
    files[`${k.name}.py`] = emitKernelModule(k);
    files[`${k.name}_launch.py`] = emitLauncher(k);
    files[`${k.name}_check.py`] = emitCheck(k);
  }
  files['check_all.py'] = emitCheckAll(kernels);
  files['manifest.json'] = manifest(g, kernels, hostOps);
  return { files, kernels, hostOps };
}

/** Options of `writeGenerated`. */
export interface TritonWriteOptions {
  /** Replace a non-empty directory (default false: its files are not ours to delete; the CLI: --force). */
  readonly overwrite?: boolean;
}

async function refuseOccupied(dir: string, opts: TritonWriteOptions): Promise<void> {
  if (opts.overwrite !== true && (await isOccupied(dir))) {
    throw new TritonError(TritonCode.IO, `output directory '${dir}' exists and is not empty`, { hint: 'pass overwrite: true (the CLI: --force) to replace it' });
  }
}

/**
 * Writes generated files into `dir` atomically (a temporary sibling renamed into place; on failure
 * `dir` is left as it was). A non-empty `dir` is refused unless `overwrite`; `TRITON_IO` on failure.
 */
export async function writeGenerated(dir: string, files: Readonly<Record<string, string>>, opts: TritonWriteOptions = {}): Promise<void> {
  await refuseOccupied(dir, opts);
  try {
    await writeFilesAtomic(dir, files);
  } catch (e) {
    throw new TritonError(TritonCode.IO, `cannot write '${dir}': ${errorMessage(e)}`, { cause: e });
  }
}

/** `stageml gen triton`: loads a residual bundle, generates, and writes the files into `outDir`. */
export async function generateTritonFromBundle(bundleDir: string, outDir: string, opts: TritonOptions & TritonWriteOptions = {}): Promise<TritonOutput> {
  await refuseOccupied(outDir, opts); // before any work: the files there are not ours
  const bundle = await loadBundle(bundleDir);
  const out = generateTriton(bundle.residual, opts);
  await writeGenerated(outDir, out.files, opts);
  return out;
}
