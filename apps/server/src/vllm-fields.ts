import type { TextTokenizer, TokenConstraint } from '@stageml/models';
import { ServerCode, ServerError } from './errors.js';

/** vLLM's extra sampling fields this server honours or refuses (docs/server.md). */
export interface VllmFields {
  readonly stop_token_ids?: readonly number[] | null | undefined;
  readonly min_tokens?: number | null | undefined;
  readonly min_p?: number | null | undefined;
  readonly include_stop_str_in_output?: boolean | null | undefined;
  readonly skip_special_tokens?: boolean | null | undefined;
  readonly spaces_between_special_tokens?: boolean | null | undefined;
  readonly truncate_prompt_tokens?: number | null | undefined;
  readonly bad_words?: readonly string[] | null | undefined;
  readonly allowed_token_ids?: readonly number[] | null | undefined;
  readonly prompt_logprobs?: number | null | undefined;
  readonly length_penalty?: number | null | undefined;
  readonly use_beam_search?: boolean | null | undefined;
  readonly stream?: boolean | null | undefined;
}

const refuse = (field: string, why: string): never => {
  throw new ServerError(ServerCode.BAD_REQUEST, `'${field}': ${why}`);
};

/**
 * Refuses the vLLM fields this server does not implement, naming each, and token ids outside the
 * vocabulary: `use_beam_search: true` and `length_penalty` other than 1 (no beam search),
 * and `prompt_logprobs` with `stream` (they are given on the whole answer only).
 */
export function checkVllmFields(f: VllmFields, vocabSize: number): void {
  if (f.use_beam_search === true) refuse('use_beam_search', 'beam search is not supported by this server');
  if (f.length_penalty != null && f.length_penalty !== 1) refuse('length_penalty', 'applies to beam search, which this server does not support');
  if (f.prompt_logprobs != null && f.stream === true) refuse('prompt_logprobs', "is not available with 'stream': true (completions stream the prompt's log-probabilities with 'echo' and 'logprobs')");
  // NOTE: spaces_between_special_tokens is accepted either way and changes nothing: vLLM applies it
  // only to slow (Python) tokenizers, and with a fast one, as every tokenizer here is (tokenizer.json),
  // special tokens are joined without spaces whatever its value.
  for (const field of ['stop_token_ids', 'allowed_token_ids'] as const) {
    const out = (f[field] ?? []).find((t) => t >= vocabSize);
    if (out !== undefined) refuse(field, `token id ${String(out)} is outside the vocabulary [0, ${String(vocabSize)})`);
  }
  if (f.allowed_token_ids?.length === 0) refuse('allowed_token_ids', 'must not be empty');
}

/** The last `truncate_prompt_tokens` tokens of a prompt (vLLM keeps the end), or the prompt. */
export function truncatePrompt(prompt: number[], f: VllmFields): number[] {
  const k = f.truncate_prompt_tokens;
  return k == null || prompt.length <= k ? prompt : prompt.slice(prompt.length - k);
}

/**
 * Token sequences of `bad_words`, as vLLM bans them: each word tokenized alone and after a space
 * (so the word-initial form is banned too), without special tokens.
 */
export function badWordIds(tok: TextTokenizer | undefined, words: readonly string[]): number[][] {
  if (words.length === 0) return [];
  if (tok === undefined) return refuse('bad_words', "needs the model's tokenizer, and this model has none");
  const out = new Map<string, number[]>();
  for (const w of words) {
    for (const text of [w, ` ${w.trimStart()}`]) {
      const ids = tok.encode(text, { addSpecialTokens: false });
      if (ids.length > 0) out.set(ids.join(','), ids);
    }
  }
  return [...out.values()];
}

const setBit = (m: Uint32Array, id: number, on: boolean): void => {
  if (id >>> 5 >= m.length) return;
  if (on) m[id >>> 5]! |= 1 << (id & 31);
  else m[id >>> 5]! &= ~(1 << (id & 31));
};

/**
 * A per-generation token filter from `allowed_token_ids` (only those, stop tokens too), `bad_words`
 * (the last token of a banned sequence is masked where the output ends with the rest of it) and
 * `min_tokens` (the stop ids masked until that many tokens were generated), combined with an
 * `inner` constraint (structured outputs) by intersecting masks; undefined when nothing filters.
 */
export function tokenFilter(
  f: VllmFields,
  opts: { readonly vocabSize: number; readonly stopIds: readonly number[]; readonly badWords: readonly (readonly number[])[]; readonly inner: (() => TokenConstraint) | undefined },
): (() => TokenConstraint) | undefined {
  const minTokens = f.min_tokens ?? 0;
  const allowed = f.allowed_token_ids ?? undefined;
  if (allowed === undefined && opts.badWords.length === 0 && (minTokens === 0 || opts.stopIds.length === 0)) return opts.inner;
  const words = (opts.vocabSize + 31) >>> 5;
  const base = new Uint32Array(words);
  if (allowed === undefined) base.fill(0xffffffff);
  else for (const id of [...allowed, ...opts.stopIds]) setBit(base, id, true);
  return () => {
    const inner = opts.inner?.();
    const out: number[] = [];
    return {
      mask(): Uint32Array {
        const m = base.slice();
        if (out.length < minTokens) for (const s of opts.stopIds) setBit(m, s, false);
        for (const w of opts.badWords) {
          const head = w.length - 1;
          if (head <= out.length && w.slice(0, head).every((t, i) => out[out.length - head + i] === t)) setBit(m, w[head]!, false);
        }
        if (inner !== undefined) {
          const im = inner.mask();
          for (let i = 0; i < m.length; i++) m[i]! &= im[i] ?? 0;
        }
        return m;
      },
      accept(id: number): void {
        out.push(id);
        inner?.accept(id);
      },
      get finished(): boolean {
        return inner?.finished ?? false;
      },
    };
  };
}
