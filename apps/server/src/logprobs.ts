import type { PickInfo } from '@stageml/models';

/** The completions API's `logprobs` object (legacy OpenAI format). */
export interface CompletionLogprobs {
  tokens: string[];
  token_logprobs: (number | null)[];
  top_logprobs: (Record<string, number> | null)[];
  text_offset: number[];
}

/**
 * Completions-format log-probabilities of `ids` (a `null` pick: the first prompt token, which has
 * none). `offset0` is where the first token's text starts in the choice's text.
 */
export function completionLogprobs(picks: readonly (PickInfo | null)[], ids: readonly number[], tokenText: (id: number) => string, offset0: number): CompletionLogprobs {
  const out: CompletionLogprobs = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  let offset = offset0;
  ids.forEach((id, i) => {
    const p = picks[i] ?? null;
    const s = tokenText(id);
    out.tokens.push(s);
    out.token_logprobs.push(p === null ? null : p.logprob);
    out.top_logprobs.push(p === null ? null : Object.fromEntries(p.top.map((t) => [tokenText(t.id), t.logprob])));
    out.text_offset.push(offset);
    offset += s.length;
  });
  return out;
}

/** The prompt's entries (with `echo`) followed by the completion's. */
export function mergeCompletionLogprobs(prompt: CompletionLogprobs, completion: CompletionLogprobs, echo: boolean): CompletionLogprobs {
  if (!echo) return completion;
  return {
    tokens: [...prompt.tokens, ...completion.tokens],
    token_logprobs: [...prompt.token_logprobs, ...completion.token_logprobs],
    top_logprobs: [...prompt.top_logprobs, ...completion.top_logprobs],
    text_offset: [...prompt.text_offset, ...completion.text_offset],
  };
}

/** One entry of the chat API's `logprobs.content`. */
export interface ChatTokenLogprob {
  token: string;
  logprob: number;
  bytes: number[];
  top_logprobs: { token: string; logprob: number; bytes: number[] }[];
}

/** Chat-format log-probabilities: `{content: [{token, logprob, bytes, top_logprobs}]}`. */
export function chatLogprobs(picks: readonly PickInfo[], tokenText: (id: number) => string): { content: ChatTokenLogprob[] } {
  const entry = (id: number, logprob: number) => {
    const token = tokenText(id);
    return { token, logprob, bytes: [...Buffer.from(token, 'utf8')] };
  };
  return { content: picks.map((p) => ({ ...entry(p.id, p.logprob), top_logprobs: p.top.map((t) => entry(t.id, t.logprob)) })) };
}

/** A prompt token's log-probability with its rank (1: the most likely) in the distribution it was scored from. */
export interface RankedPick extends PickInfo {
  readonly rank: number;
}

/** One position of vLLM's `prompt_logprobs`: token id → its log-probability, rank and text. */
export type PromptLogprobEntry = Record<string, { logprob: number; rank: number; decoded_token: string }>;

/**
 * vLLM's `prompt_logprobs` of a prompt: `null` for the first token (nothing precedes it), then per
 * position the prompt's own token and the `prompt_logprobs` most likely ones (ranks from 1), keyed
 * by token id.
 */
export function vllmPromptLogprobs(picks: readonly (RankedPick | null)[], tokenText: (id: number) => string): (PromptLogprobEntry | null)[] {
  return picks.map((p) => {
    if (p === null) return null;
    const entry: PromptLogprobEntry = { [String(p.id)]: { logprob: p.logprob, rank: p.rank, decoded_token: tokenText(p.id) } };
    p.top.forEach((t, i) => {
      entry[String(t.id)] ??= { logprob: t.logprob, rank: i + 1, decoded_token: tokenText(t.id) };
    });
    return entry;
  });
}
