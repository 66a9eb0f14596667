import type { Command } from 'commander';
import { generateCudaFromBundle } from '@stageml/sm90-native';
import { generateTritonFromBundle } from '@stageml/triton-gen';
import type { CliIo } from '../io.js';

interface GenOptions {
  out: string;
  strict?: boolean;
  json?: boolean;
  force?: boolean;
}

interface GenSummary {
  readonly target: 'triton' | 'cuda';
  readonly out: string;
  readonly kernels: readonly { readonly name: string; readonly kind: string; readonly dtype: string }[];
  readonly hostOps: readonly { readonly op: string; readonly value: string; readonly reason: string }[];
  readonly files: readonly string[];
}

function report(io: CliIo, full: GenSummary, json: boolean | undefined): void {
  const s: GenSummary = { ...full, kernels: full.kernels.map((k) => ({ name: k.name, kind: k.kind, dtype: k.dtype })) };
  if (json === true) {
    io.out(JSON.stringify(s));
    return;
  }
  io.out(`wrote ${String(s.files.length)} files to ${s.out}`);
  for (const k of s.kernels) io.out(`  kernel ${k.name}: ${k.kind} (${k.dtype})`);
  if (s.hostOps.length > 0) io.out(`  ${String(s.hostOps.length)} ops left to the host executor (${[...new Set(s.hostOps.map((h) => h.op))].join(', ')})`);
}

/**
 * `stageml gen triton|cuda BUNDLE --out DIR`: generate GPU kernels for the LoRA, bank (SGMV/BGMV)
 * and MoE-LoRA patterns of a residual bundle. `triton` writes kernels, launchers and
 * check-and-bench scripts (Python); `cuda` writes sm_90a translation units for native/.
 */
export function registerGen(program: Command, io: CliIo): void {
  const gen = program.command('gen').description('generate GPU kernels (Triton or CUDA sm_90a) from a residual bundle');
  gen
    .command('triton')
    .description('Triton kernels + launchers + check-and-bench scripts for the bundle\'s LoRA, bank and MoE patterns (f32, bf16 or f16 bundles)')
    .argument('<bundle>', 'residual bundle directory (from stageml stage)')
    .requiredOption('--out <dir>', 'output directory (an existing non-empty one only with --force)')
    .option('--force', 'replace an existing non-empty output directory')
    .option('--strict', 'fail (TRITON_UNSUPPORTED_OP) when an op is left to the host executor')
    .option('--json', 'print a JSON summary')
    .action(async (bundle: string, opts: GenOptions) => {
      const r = await generateTritonFromBundle(bundle, opts.out, { strict: opts.strict === true, overwrite: opts.force === true });
      report(io, { target: 'triton', out: opts.out, kernels: r.kernels, hostOps: r.hostOps, files: Object.keys(r.files) }, opts.json);
    });
  gen
    .command('cuda')
    .description('CUDA C++ (sm_90a, tensor cores) for the bundle\'s LoRA, bank and MoE patterns (bf16 or f16 bundles; f32 is refused); build with native/build.py')
    .argument('<bundle>', 'residual bundle directory (from stageml stage)')
    .requiredOption('--out <dir>', 'output directory (an existing non-empty one only with --force)')
    .option('--force', 'replace an existing non-empty output directory')
    .option('--strict', 'fail (SM90_UNSUPPORTED_OP) when an op is left to the host executor')
    .option('--json', 'print a JSON summary')
    .action(async (bundle: string, opts: GenOptions) => {
      const r = await generateCudaFromBundle(bundle, opts.out, { strict: opts.strict === true, overwrite: opts.force === true });
      report(io, { target: 'cuda', out: opts.out, kernels: r.kernels, hostOps: r.hostOps, files: Object.keys(r.files) }, opts.json);
    });
}
