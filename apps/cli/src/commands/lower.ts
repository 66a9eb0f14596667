import { writeFile } from 'node:fs/promises';
import { type Command, InvalidArgumentError } from 'commander';
import { type ConstantsMode, LowerCode, LowerError, findMlirTools, lowerToMlir, verifyMlir } from '@stageml/mlir-lower';
import { loadBundle } from '@stageml/runtime';
import { parseNonNegativeInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import type { CliIo } from '../io.js';
import { errorMessage } from '@stageml/ir';

interface LowerMlirOptions {
  out: string;
  inlineLimit?: number;
  constants?: ConstantsMode;
  function?: string;
  verify?: boolean;
  json?: boolean;
}

function parseConstantsMode(value: string): ConstantsMode {
  if (value !== 'args' && value !== 'resources') throw new InvalidArgumentError(`expected 'args' or 'resources', got '${value}'`);
  return value;
}

/**
 * `stageml lower mlir BUNDLE --out FILE.mlir`: lower a residual bundle to MLIR text (func, arith,
 * math, linalg, tensor, scf), with large constants as function arguments or `dense_resource`
 * blobs; `--verify` also runs mlir-opt --verify-each through the LLVM lowering pipeline.
 */
export function registerLower(program: Command, io: CliIo): void {
  const lower = program.command('lower').description('lower a residual bundle to a backend');
  lower
    .command('mlir')
    .description('lower a residual bundle to MLIR (func, arith, math, linalg, tensor, scf)')
    .argument('<bundle>', 'residual bundle directory (from stageml stage)')
    .requiredOption('--out <file>', 'the .mlir file to write')
    .option('--inline-limit <n>', 'inline constants with at most n elements as dense literals (default 16)', parseNonNegativeInt)
    .option('--constants <mode>', 'larger constants as function arguments (args, default) or dense_resource blobs (resources)', parseConstantsMode)
    .option('--function <name>', 'name of the emitted function (default: the graph name)')
    .option('--verify', 'verify with mlir-opt --verify-each through the LLVM lowering pipeline')
    .option('--json', 'print a JSON summary')
    .action(async (dir: string, opts: LowerMlirOptions) => {
      const bundle = await loadBundle(dir);
      const module = lowerToMlir(bundle.residual, bundle.constants, {
        ...(opts.inlineLimit === undefined ? {} : { inlineLimit: opts.inlineLimit }),
        ...(opts.constants === undefined ? {} : { constants: opts.constants }),
        ...(opts.function === undefined ? {} : { functionName: opts.function }),
      });
      try {
        await writeFile(opts.out, module.text);
      } catch (e) {
        throw new CliError(CliCode.IO, `cannot write '${opts.out}': ${errorMessage(e)}`, { cause: e });
      }
      let verified: boolean | undefined;
      if (opts.verify === true) {
        const found = findMlirTools();
        if (found.status === 'missing') throw new LowerError(LowerCode.TOOL_MISSING, `cannot verify: ${found.reason}`, { hint: found.hint });
        const r = await verifyMlir(module.text, found.tools, { pipeline: 'llvm' });
        if (!r.ok) throw new LowerError(LowerCode.TOOL_FAILED, `mlir-opt rejected ${opts.out}:\n${r.diagnostics}`);
        verified = true;
      }
      const f = module.function;
      const count = (k: string): number => f.arguments.filter((a) => a.kind === k).length;
      const summary = {
        out: opts.out,
        function: f.name,
        bytes: Buffer.byteLength(module.text),
        inputs: count('input'),
        constantArguments: count('constant'),
        externalParams: count('param'),
        resources: f.resources.length,
        results: f.results.map((r) => ({ name: r.name, type: r.mlirType })),
        ...(verified === undefined ? {} : { verified }),
      };
      if (opts.json === true) {
        io.out(JSON.stringify(summary, null, 2));
        return;
      }
      io.out(`wrote ${opts.out}: @${f.name} (${String(summary.bytes)} bytes)`);
      io.out(`  arguments: ${String(summary.inputs)} inputs, ${String(summary.constantArguments)} constants, ${String(summary.externalParams)} external parameters; ${String(summary.resources)} resource blobs`);
      io.out(`  results: ${summary.results.map((r) => `${r.name}: ${r.type}`).join(', ')}`);
      if (verified === true) io.out('  verified: mlir-opt --verify-each through the LLVM pipeline');
    });
}
