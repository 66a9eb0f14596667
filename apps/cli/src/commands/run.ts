import { basename, join } from 'node:path';
import { readFile, readdir } from 'node:fs/promises';
import type { Command } from 'commander';
import { Engine } from '@stageml/engine';
import { parseLoraConfig } from '@stageml/peft';
import { writeSafetensors } from '@stageml/safetensors';
import { parseIds, parseNames } from '../args.js';
import { CliCode, CliError } from '../errors.js';
import { probeShapeOf, resolveExecutor } from '../executors.js';
import { inPhase } from '../progress.js';
import type { CliIo } from '../io.js';
import { errorMessage } from '@stageml/ir';

interface RunOptions {
  model: string;
  adapter?: string;
  adapters?: string;
  mixed?: string[];
  ids: number[];
  out: string;
  executor?: string;
  json?: boolean;
}

/**
 * Loads a model into a serving engine sized for the adapters named by `--adapter DIR` (one, applied
 * to every row: `single` is its name) or `--adapters DIR` (one per subdirectory, by its name) and
 * loads them; the engine's slots are as many as the adapters and as wide as their highest rank.
 */
export async function loadEngineWithAdapters(opts: { model: string; adapter?: string | undefined; adapters?: string | undefined; executor?: string | undefined }, io: CliIo): Promise<{ engine: Engine; single: string | undefined }> {
  const named: [string | undefined, string][] = opts.adapter !== undefined ? [[undefined, opts.adapter]] : opts.adapters !== undefined ? (await adapterDirs(opts.adapters)).map((n) => [n, join(opts.adapters!, n)]) : [];
  const ranks = (await Promise.all(named.map(([, d]) => adapterRank(d)))).filter((r): r is number => r !== undefined);
  const shape = opts.executor === 'auto' ? await probeShapeOf(opts.model, { maxBatch: 1 }) : undefined;
  const executor = await resolveExecutor(opts.executor, { shape });
  const engine = await inPhase(io, `loading ${opts.model}`, () => Engine.load(opts.model, { executor, maxLoras: Math.max(1, named.length), maxLoraRank: Math.max(1, ...ranks) }));
  try {
    let single: string | undefined;
    for (const [name, dir] of named) {
      const loaded = await engine.loadAdapter(dir, name);
      if (name === undefined) single = loaded.name;
    }
    return { engine, single };
  } catch (e) {
    engine.dispose();
    throw e;
  }
}

/** The subdirectories of `dir`, sorted: the adapters of `--adapters`. */
async function adapterDirs(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir, { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => e.name).sort();
  } catch (e) {
    throw new CliError(CliCode.IO, `cannot list adapters in '${dir}': ${errorMessage(e)}`, { cause: e });
  }
}

/** The highest rank an adapter's config gives any module (`r`, `rank_pattern`); undefined when it cannot be read (loading reports why). */
async function adapterRank(dir: string): Promise<number | undefined> {
  const file = join(dir, 'adapter_config.json');
  try {
    const c = parseLoraConfig(await readFile(file, 'utf8'), file);
    return Math.max(c.r, ...Object.values(c.rankPattern));
  } catch {
    return undefined;
  }
}

/**
 * `stageml run`: logits of token ids through a model (one adapter, or a mixed batch), to safetensors.
 * It runs the serving engine (`Engine.promptLogits`: the slot program with logits at every position),
 * so it takes every adapter kind `stageml serve` takes: LoRA with `lora_bias`, DoRA, trainable tokens,
 * `modules_to_save` (a tied `lm_head` included), expert LoRA.
 */
export function registerRun(program: Command, io: CliIo): void {
  program
    .command('run')
    .description('run token ids through a model and write the logits (F32) to a safetensors file')
    .requiredOption('--model <dir>', 'Hugging Face model directory (config.json, model.safetensors)')
    .option('--adapter <dir>', 'a PEFT adapter directory applied to every row')
    .option('--adapters <dir>', 'a directory of PEFT adapter directories (for --mixed)')
    .option('--mixed <names>', 'one row per adapter name (__base__ = no adapter); writes logits [rows, T, vocab]', parseNames)
    .requiredOption('--ids <ids>', 'comma-separated token ids', parseIds)
    .requiredOption('--out <file>', 'output .safetensors file (tensor `logits`)')
    .option('--executor <name>', 'executor: auto, onnxruntime, cpu-native, torch, tfjs-wasm, tfjs-cpu, interpreter (default: interpreter, exact)')
    .option('--json', 'print a JSON summary')
    .action(async (opts: RunOptions) => {
      if (opts.mixed !== undefined && opts.adapters === undefined) throw new CliError(CliCode.USAGE, '--mixed needs --adapters DIR');
      if (opts.mixed !== undefined && opts.adapter !== undefined) throw new CliError(CliCode.USAGE, 'use either --adapter or --mixed, not both');
      const { engine, single } = await loadEngineWithAdapters(opts, io);
      try {
        const rows = (opts.mixed ?? [single ?? '__base__']).map((r) => (r === '__base__' ? undefined : r));
        const V = engine.config.vocabSize;
        const T = opts.ids.length;
        const data = new Float32Array(rows.length * T * V);
        for (const [i, adapter] of rows.entries()) data.set((await engine.promptLogits(adapter, opts.ids)).data, i * T * V);
        const out = { dtype: 'f32' as const, shape: opts.mixed === undefined ? [T, V] : [rows.length, T, V], data };
        await writeSafetensors(opts.out, { logits: out }, { producer: 'stageml run' });
        const summary = { out: opts.out, shape: out.shape, rows: rows.map((r) => r ?? '__base__'), executor: engine.executorName };
        io.out(opts.json === true ? JSON.stringify(summary) : `wrote logits [${out.shape.join(', ')}] to ${basename(opts.out)} (${summary.rows.join(', ')})`);
      } finally {
        engine.dispose();
      }
    });
}
