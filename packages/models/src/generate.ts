import type { CausalLM, KvCache } from './causal-lm.js';
import { ModelCode, ModelError } from './errors.js';
import { type SamplingOptions, makePicker } from './sampling.js';

/** Options of `generate`. */
export interface GenerateOptions {
  /** Adapter name (default: the base model). */
  readonly adapter?: string | undefined;
  /** Most new tokens (≥ 1). */
  readonly maxNewTokens: number;
  /** Greedy or sampling (default greedy). */
  readonly sampling?: SamplingOptions;
  /** Token ids that end generation (default: the config's `eos_token_id`); the stop token is kept. */
  readonly stopTokens?: readonly number[];
  /**
   * A padding token id: prompt tokens equal to it are masked out of attention and skipped by the
   * rotary positions, as HF `generate` does when it infers the attention mask from `pad_token_id`.
   */
  readonly padTokenId?: number | undefined;
  /** Called with each new token as it is chosen (streaming). */
  readonly onToken?: (id: number) => void;
}

/** What `generate` produced. */
export interface GenerateResult {
  /** New token ids, the stop token included when one ended generation. */
  readonly newIds: number[];
  /** Why generation ended. */
  readonly finishReason: 'stop' | 'length';
  /** Decoded text of the new tokens (special tokens dropped), when the model has a tokenizer. */
  readonly text: string | undefined;
  /** Prompt tokens processed. */
  readonly promptTokens: number;
}

/**
 * Generates a continuation of `prompt`: one prefill step over the prompt, then one decode step per
 * new token with the KV cache as a late input. Greedy decoding picks the first maximum (as
 * `torch.argmax`); sampling applies temperature, top-k and top-p in HF's order with a seeded stream.
 */
export async function generate(lm: CausalLM, prompt: readonly number[], opts: GenerateOptions): Promise<GenerateResult> {
  if (!Number.isInteger(opts.maxNewTokens) || opts.maxNewTokens < 1) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `max new tokens must be a positive integer, got ${String(opts.maxNewTokens)}`);
  }
  if (prompt.length === 0) throw new ModelError(ModelCode.BAD_OPTIONS, 'the prompt is empty');
  if (prompt.length + opts.maxNewTokens > lm.config.maxPositions) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `prompt (${String(prompt.length)}) + max new tokens (${String(opts.maxNewTokens)}) exceeds the model's ${String(lm.config.maxPositions)} positions`);
  }
  const pick = makePicker(opts.sampling ?? { greedy: true });
  const stop = new Set(opts.stopTokens ?? lm.config.eosTokenIds);
  const adapters = [opts.adapter];
  const vocab = lm.config.vocabSize;
  const mask = [prompt.map((t) => (opts.padTokenId !== undefined && t === opts.padTokenId ? 0 : 1))];
  let step = await lm.forward([prompt], { adapters, mask });
  const newIds: number[] = [];
  let cache: KvCache = step.cache;
  for (;;) {
    const logits = step.logits;
    const last = logits.data.subarray(logits.data.length - vocab);
    const id = pick(last);
    newIds.push(id);
    opts.onToken?.(id);
    if (stop.has(id)) return finish('stop');
    if (newIds.length >= opts.maxNewTokens) return finish('length');
    step = await lm.forward([[id]], { adapters, cache });
    cache = step.cache;
  }
  function finish(reason: 'stop' | 'length'): GenerateResult {
    return { newIds, finishReason: reason, text: lm.tokenizer?.decode(newIds), promptTokens: prompt.length };
  }
}
