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
