import type { SamplingOptions } from './sampling.js';

/**
 * Options of a generation (`generateWithEngine` of @stageml/engine; the server's and CLI's requests
 * map onto it).
 */
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

/** What a generation produced. */
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
