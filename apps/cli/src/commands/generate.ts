import type { Command } from 'commander';
import { generateWithEngine } from '@stageml/engine';
import type { SamplingOptions } from '@stageml/models';
import { parseIds, parseNonNegativeInt, parseNumber, parsePositiveInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import type { CliIo } from '../io.js';
import { loadEngineWithAdapters } from './run.js';

interface GenerateCliOptions {
  model: string;
  adapter?: string;
  prompt?: string;
  ids?: number[];
  maxNewTokens: number;
  greedy?: boolean;
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  padTokenId?: number;
  ignoreEos?: boolean;
  executor?: string;
  json?: boolean;
}

/**
 * `stageml generate`: continue a prompt (text or ids) with a model and optional adapter. It runs the
 * serving engine (`generateWithEngine`: one prefill run, then a decode step per token), so it takes
 * every adapter kind `stageml run` and `stageml serve` take.
 */
export function registerGenerate(program: Command, io: CliIo): void {
  program
    .command('generate')
    .description('generate a continuation of a prompt (greedy or sampled)')
    .requiredOption('--model <dir>', 'Hugging Face model directory')
    .option('--adapter <dir>', 'a PEFT adapter directory')
    .option('--prompt <text>', 'prompt text (tokenized with the model tokenizer)')
    .option('--ids <ids>', 'prompt token ids, comma-separated', parseIds)
    .requiredOption('--max-new-tokens <n>', 'most new tokens', parsePositiveInt)
    .option('--greedy', 'greedy decoding (the default unless sampling flags are given)')
    .option('--temperature <t>', 'sampling temperature', parseNumber)
    .option('--top-p <p>', 'nucleus sampling mass', parseNumber)
    .option('--top-k <k>', 'sample among the k most likely tokens', parseNonNegativeInt)
    .option('--seed <s>', 'sampling seed', parseNonNegativeInt)
    .option('--pad-token-id <id>', 'mask prompt tokens equal to this id (as HF generate with pad_token_id)', parseNonNegativeInt)
    .option('--ignore-eos', 'do not stop at the end-of-sequence token')
    .option('--executor <name>', 'executor: auto, onnxruntime, cpu-native, torch, tfjs-wasm, tfjs-cpu, interpreter (default: interpreter, exact)')
    .option('--json', 'print {"new_ids": [...], "text": "..."}')
    .action(async (opts: GenerateCliOptions) => {
      if ((opts.prompt === undefined) === (opts.ids === undefined)) throw new CliError(CliCode.USAGE, 'give exactly one of --prompt or --ids');
      const sampled = opts.temperature !== undefined || opts.topP !== undefined || opts.topK !== undefined || opts.seed !== undefined;
      if (opts.greedy === true && sampled) throw new CliError(CliCode.USAGE, '--greedy cannot be combined with sampling flags');
      const { engine, single } = await loadEngineWithAdapters(opts, io);
      try {
        let ids = opts.ids;
        if (ids === undefined) {
          if (engine.tokenizer === undefined) throw new CliError(CliCode.USAGE, `${opts.model} has no tokenizer.json: use --ids`);
          ids = engine.tokenizer.encode(opts.prompt!);
        }
        const sampling: SamplingOptions = sampled
          ? {
              ...(opts.temperature === undefined ? {} : { temperature: opts.temperature }),
              ...(opts.topP === undefined ? {} : { topP: opts.topP }),
              ...(opts.topK === undefined ? {} : { topK: opts.topK }),
              ...(opts.seed === undefined ? {} : { seed: opts.seed }),
            }
          : { greedy: true };
        const result = await generateWithEngine(engine, ids, {
          adapter: single,
          maxNewTokens: opts.maxNewTokens,
          sampling,
          padTokenId: opts.padTokenId,
          ...(opts.ignoreEos === true ? { stopTokens: [] } : {}),
        });
        if (opts.json === true) io.out(JSON.stringify({ new_ids: result.newIds, text: result.text ?? null, finish_reason: result.finishReason }));
        else io.out(result.text ?? result.newIds.join(','));
      } finally {
        engine.dispose();
      }
    });
}
