import { weightQuantChooser } from '@stageml/planner';
import { type QuantizeLinearsOptions, type WeightQuantSpec, parseWeightQuantSpec } from '@stageml/runtime';
import { errorMessage } from '@stageml/ir';
import { CliCode, CliError } from './errors.js';

/** Per-weight decisions of `--quantize auto`, by weight name. */
export type AutoDecisions = Map<string, { readonly choice: WeightQuantSpec | undefined; readonly relative: number }>;

/**
 * The quantization `--quantize SPEC [--max-error E]` asks for: `int8`/`int4` (blocks of 32,
 * symmetric), `int8:g128`, `int4:channel`, `…:asym`, or `auto`, where the planner's weight
 * quantization bound picks int4, int8 or f32 per projection so that each stays within the relative
 * error E. Bad combinations are `CLI_USAGE`.
 */
export function quantizeOptions(spec: string | undefined, maxError: number | undefined, decisions?: AutoDecisions): QuantizeLinearsOptions | undefined {
  if (spec === undefined) {
    if (maxError !== undefined) throw new CliError(CliCode.USAGE, '--max-error applies to --quantize auto only');
    return undefined;
  }
  if (spec === 'auto') {
    if (maxError === undefined) throw new CliError(CliCode.USAGE, '--quantize auto needs --max-error E (the largest relative weight error a projection may take)');
    return { choose: weightQuantChooser(maxError, undefined, decisions) };
  }
  if (maxError !== undefined) throw new CliError(CliCode.USAGE, '--max-error applies to --quantize auto only');
  try {
    return { spec: parseWeightQuantSpec(spec) };
  } catch (e) {
    throw new CliError(CliCode.USAGE, errorMessage(e), { cause: e, hint: 'use int8, int4, int8:g128, int4:channel, int4:g32:asym or auto' });
  }
}

/** Parses `--max-error` (a finite number ≥ 0). */
export function parseMaxError(v: string): number {
  const x = Number(v);
  if (v.trim() === '' || !Number.isFinite(x) || x < 0) throw new CliError(CliCode.USAGE, `--max-error must be a number ≥ 0, got '${v}'`);
  return x;
}
