import { readFile } from 'node:fs/promises';
import type { Command } from 'commander';
import { parseRouterConfig } from '@stageml/router';
import { createServer } from '@stageml/server';
import { parseNonNegativeInt, parsePositiveInt } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import { EXECUTOR_NAMES, resolveExecutor } from '../executors.js';
import type { CliIo } from '../io.js';
import { parseMaxError, quantizeOptions } from '../quantize.js';

interface ServeOptions {
  model: string;
  servedModelName?: string;
  adapters?: string;
  host: string;
  port: number;
  config?: string;
  executor?: string;
  padTokenId?: number;
  maxBatch?: number;
  maxQueue?: number;
  adminKey?: string;
  log?: boolean;
  quantize?: string;
  maxError?: number;
}

/** `stageml serve`: the reference server (OpenAI-compatible API) on a model and its adapters. */
export function registerServe(program: Command, io: CliIo): void {
  program
    .command('serve')
    .description('serve a model and its adapters behind an OpenAI-compatible HTTP API')
    .requiredOption('--model <dir>', 'Hugging Face model directory')
    .option('--served-model-name <name>', 'name clients use for the base model (default: the directory name)')
    .option('--adapters <dir>', 'a directory of PEFT adapter directories, loaded at start')
    .option('--host <host>', 'address to listen on', '127.0.0.1')
    .option('--port <n>', 'port (0: any free port)', parseNonNegativeInt, 8000)
    .option('--config <file>', 'tenants, API keys, adapters and staged plans (JSON, docs/server.md)')
    .option('--executor <name>', `executor: ${EXECUTOR_NAMES.join(', ')} (default: auto, the fastest measured here)`, 'auto')
    .option('--pad-token-id <id>', 'mask prompt tokens equal to this id (HF pad_token_id semantics)', parseNonNegativeInt)
    .option('--max-batch <n>', 'most sequences decoded together', parsePositiveInt)
    .option('--max-queue <n>', 'most queued requests before 429', parsePositiveInt)
    .option('--admin-key <key>', 'key allowed to load/unload adapters when tenants are configured')
    .option('--log', 'log every request')
    .option('--quantize <spec>', 'weight-only quantization of the linear layers: int8, int4 (blocks of 32), int8:g128, int4:channel, …:asym, or auto (with --max-error)')
    .option('--max-error <e>', 'with --quantize auto: the largest relative weight error per projection', parseMaxError)
    .action(async (opts: ServeOptions) => {
      const quantize = quantizeOptions(opts.quantize, opts.maxError);
      let config;
      if (opts.config !== undefined) {
        let text: string;
        try {
          text = await readFile(opts.config, 'utf8');
        } catch (e) {
          throw new CliError(CliCode.IO, `cannot read '${opts.config}': ${(e as Error).message}`, { cause: e });
        }
        config = parseRouterConfig(text, opts.config);
      }
      const server = await createServer({
        modelDir: opts.model,
        ...(opts.servedModelName === undefined ? {} : { modelName: opts.servedModelName }),
        executor: await resolveExecutor(opts.executor, { log: (line) => { io.out(line); } }),
        ...(quantize === undefined ? {} : { quantize }),
        ...(opts.adapters === undefined ? {} : { adaptersDir: opts.adapters }),
        ...(config === undefined ? {} : { config }),
        ...(opts.padTokenId === undefined ? {} : { padTokenId: opts.padTokenId }),
        ...(opts.maxBatch === undefined ? {} : { maxBatch: opts.maxBatch }),
        ...(opts.maxQueue === undefined ? {} : { maxQueue: opts.maxQueue }),
        ...(opts.adminKey === undefined ? {} : { adminKey: opts.adminKey }),
        logger: opts.log === true,
      });
      const address = await server.listen(opts.host, opts.port);
      const models = [server.modelName, ...server.lm.adapterNames];
      io.out(`stageml server ready on ${address} · model ${server.modelName} · adapters: ${server.lm.adapterNames.join(', ') || 'none'} · executor ${server.lm.executorName}`);
      io.out(`try: curl -s ${address}/v1/completions -H 'content-type: application/json' -d '{"model": "${models[1] ?? models[0]!}", "prompt": "The staged program", "max_tokens": 12, "temperature": 0}'`);
      await new Promise<void>((resolve) => {
        const stop = (signal: string): void => {
          io.out(`${signal}: draining in-flight requests…`);
          void server.shutdown().then(() => {
            io.out('stopped');
            resolve();
          });
        };
        process.once('SIGTERM', () => {
          stop('SIGTERM');
        });
        process.once('SIGINT', () => {
          stop('SIGINT');
        });
      });
    });
}
