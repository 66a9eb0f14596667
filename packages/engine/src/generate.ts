import { type GenerateOptions, type GenerateResult, ModelCode, ModelError, makePicker } from '@stageml/models';
import { PeftCode, PeftError } from '@stageml/peft';
import type { Engine } from './engine.js';

/**
 * Generates a continuation of `prompt` on `engine` (`GenerateOptions` / `GenerateResult` of
 * @stageml/models; bad options are `MODEL_BAD_OPTIONS`): the prompt is prefilled in one run (one
 * chunk, no stream to stall), then one decode step per new token over the sequence's resident KV.
 * Each token is picked from the last position's logits on the host by `makePicker` — greedy the
 * first maximum, sampling temperature, top-k and top-p in HF's order with a seeded stream — so the
 * same logits give the same tokens on every executor. Generation stops at a stop token (kept) or after
 * `maxNewTokens`; the sequence is released on every exit. Every adapter kind the engine serves
 * (`loadAdapter`) generates: LoRA with `lora_bias`, DoRA, trainable tokens, `modules_to_save`,
 * expert LoRA.
 */
export async function generateWithEngine(engine: Engine, prompt: readonly number[], opts: GenerateOptions): Promise<GenerateResult> {
  if (!Number.isInteger(opts.maxNewTokens) || opts.maxNewTokens < 1) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `max new tokens must be a positive integer, got ${String(opts.maxNewTokens)}`);
  }
  if (prompt.length === 0) throw new ModelError(ModelCode.BAD_OPTIONS, 'the prompt is empty');
  if (prompt.length + opts.maxNewTokens > engine.config.maxPositions) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `prompt (${String(prompt.length)}) + max new tokens (${String(opts.maxNewTokens)}) exceeds the model's ${String(engine.config.maxPositions)} positions`);
  }
  const pick = makePicker(opts.sampling ?? { greedy: true });
  const stop = new Set(opts.stopTokens ?? engine.config.eosTokenIds);
  const mask = prompt.map((t) => (opts.padTokenId !== undefined && t === opts.padTokenId ? 0 : 1));
  const seq = engine.open(opts.adapter, prompt, mask);
  const newIds: number[] = [];
  const finish = (reason: 'stop' | 'length'): GenerateResult => ({ newIds, finishReason: reason, text: engine.tokenizer?.decode(newIds), promptTokens: prompt.length });
  try {
    if (!(await engine.attach(seq))) throw new PeftError(PeftCode.CACHE_FULL, 'every adapter slot is held by running adapters; retry when a request finishes');
    let logits: Float32Array | undefined;
    while (logits === undefined) logits = await engine.prefill(seq, { maxChunk: prompt.length });
    for (;;) {
      const id = pick(logits);
      newIds.push(id);
      opts.onToken?.(id);
      if (stop.has(id)) return finish('stop');
      if (newIds.length >= opts.maxNewTokens) return finish('length');
      logits = (await engine.decode([seq], [id]))[0]!;
    }
  } finally {
    engine.release(seq);
  }
}
