import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { errorMessage } from '@stageml/ir';
import { CliCode, CliError } from './errors.js';

/** `vllm serve` flags `stageml serve` accepts beside its own. */
export interface VllmServeFlags {
  /** `--enable-prefix-caching` (true) / `--no-enable-prefix-caching` (false). */
  readonly enablePrefixCaching?: boolean;
  readonly chatTemplate?: string;
  readonly generationConfig?: string;
  readonly enableAutoToolChoice?: boolean;
  readonly toolCallParser?: string;
  readonly quantization?: string;
}

/** What the vLLM flags become in our server's options. */
export interface VllmServeOptions {
  /** Automatic prefix caching (`--enable-prefix-caching`, vLLM's default; off with `--no-enable-prefix-caching`). */
  readonly prefixCaching: boolean;
  readonly chatTemplate?: string;
  readonly generationDefaults?: Readonly<Record<string, number>>;
  readonly enableAutoToolChoice?: boolean;
  readonly toolCallParser?: 'hermes' | 'llama3_json' | 'mistral';
  /** Lines to print at start (flags accepted without an effect here, and why). */
  readonly notes: readonly string[];
}

const usage = (msg: string): never => {
  throw new CliError(CliCode.USAGE, msg);
};

/** vLLM's `--dtype` names mapped to ours (`auto`: our default for the executor). */
const VLLM_DTYPES: Readonly<Record<string, string | undefined>> = { auto: undefined, bfloat16: 'bf16', half: 'f16', float16: 'f16', float32: 'f32', float: 'f32' };

/**
 * Our `--dtype` value for a vLLM or our own name: `auto` → undefined (the default: the checkpoint's
 * dtype on torch, f32 elsewhere), `bfloat16` → bf16, `half`/`float16` → f16, `float32`/`float` →
 * f32; our names pass through (checked later).
 */
export function dtypeOf(dtype: string | undefined): string | undefined {
  if (dtype === undefined) return undefined;
  return dtype in VLLM_DTYPES ? VLLM_DTYPES[dtype] : dtype;
}

/** Sampling defaults of a model's `generation_config.json` that vLLM applies (its `--generation-config auto`). */
const GENERATION_KEYS: Readonly<Record<string, string>> = { temperature: 'temperature', top_p: 'top_p', top_k: 'top_k', repetition_penalty: 'repetition_penalty' };

async function generationDefaults(dir: string): Promise<Record<string, number> | undefined> {
  let text: string;
  try {
    text = await readFile(join(dir, 'generation_config.json'), 'utf8');
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return undefined;
    throw new CliError(CliCode.IO, `cannot read ${join(dir, 'generation_config.json')}: ${errorMessage(e)}`, { cause: e });
  }
  let cfg: Record<string, unknown>;
  try {
    cfg = JSON.parse(text) as Record<string, unknown>;
  } catch (e) {
    throw new CliError(CliCode.IO, `${join(dir, 'generation_config.json')} is not JSON: ${errorMessage(e)}`, { cause: e });
  }
  const out: Record<string, number> = {};
  for (const [k, field] of Object.entries(GENERATION_KEYS)) if (typeof cfg[k] === 'number') out[field] = cfg[k];
  // A config that does not sample (do_sample false) asks for greedy picks, as transformers reads it.
  if (cfg['do_sample'] === false && out['temperature'] !== undefined) out['temperature'] = 0;
  return Object.keys(out).length === 0 ? undefined : out;
}

/**
 * Our options from vLLM's serve flags (`--max-num-seqs`, `--max-num-batched-tokens` and
 * `--gpu-memory-utilization` are handled by `serve` itself). `--generation-config auto` (vLLM's default: `stageml serve` reads the model's
 * `generation_config.json` unless `vllm`, or a directory holding one) gives request defaults.
 * `--chat-template` is a file or a template's text. `--enable-auto-tool-choice` needs
 * `--tool-call-parser` (hermes, llama3_json, mistral). `--enable-prefix-caching` is the default;
 * `--no-enable-prefix-caching` turns prefix caching off. Refused with `CLI_USAGE` naming our
 * equivalent: `--quantization` (vLLM's quantized checkpoint formats; our weight-only
 * quantization is `--quantize`).
 */
export async function vllmServeOptions(flags: VllmServeFlags, ours: { readonly modelDir?: string | undefined }): Promise<VllmServeOptions> {
  const notes: string[] = [];
  if (flags.quantization !== undefined && flags.quantization !== 'none') usage(`--quantization ${flags.quantization}: vLLM's quantized checkpoint formats are not read; our weight-only quantization of a float checkpoint is --quantize (int8, int4, …)`);
  const parsers = ['hermes', 'llama3_json', 'mistral'] as const;
  if (flags.toolCallParser !== undefined && !(parsers as readonly string[]).includes(flags.toolCallParser)) usage(`--tool-call-parser must be one of ${parsers.join(', ')}, got '${flags.toolCallParser}'`);
  if (flags.enableAutoToolChoice === true && flags.toolCallParser === undefined) usage('--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json or mistral)');
  let chatTemplate: string | undefined;
  if (flags.chatTemplate !== undefined) {
    const isFile = await stat(flags.chatTemplate).then((s) => s.isFile(), () => false);
    if (isFile) chatTemplate = await readFile(flags.chatTemplate, 'utf8');
    else if (/[{%]/.test(flags.chatTemplate)) chatTemplate = flags.chatTemplate;
    else usage(`--chat-template '${flags.chatTemplate}' is neither a file nor a template`);
  }
  const gc = flags.generationConfig ?? 'auto';
  const from = gc === 'vllm' ? undefined : gc === 'auto' ? ours.modelDir : gc;
  const defaults = from === undefined ? undefined : await generationDefaults(from);
  if (defaults !== undefined) notes.push(`request defaults from ${join(from!, 'generation_config.json')}: ${JSON.stringify(defaults)} (--generation-config vllm to ignore them)`);
  return {
    prefixCaching: flags.enablePrefixCaching ?? true,
    ...(chatTemplate === undefined ? {} : { chatTemplate }),
    ...(defaults === undefined ? {} : { generationDefaults: defaults }),
    ...(flags.enableAutoToolChoice === true ? { enableAutoToolChoice: true, toolCallParser: flags.toolCallParser as (typeof parsers)[number] } : {}),
    notes,
  };
}
