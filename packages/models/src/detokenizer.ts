import type { TextTokenizer } from './tokenizer.js';

/** U+FFFD: what a decoder yields for bytes that do not (yet) form a UTF-8 sequence. */
const REPLACEMENT = '\uFFFD';

/**
 * Incremental detokenization, as vLLM's `detokenize_incrementally`: each pushed token id returns the
 * text it adds, decoding only a short window (`prefix`..end) and holding text back while it ends in
 * U+FFFD (an incomplete UTF-8 sequence: a byte-level BPE token or SentencePiece `<0x..>` bytes
 * that a later token completes). `flush` releases what is held at the end. The concatenation of
 * all deltas is the text, and for well-formed text it equals `tokenizer.decode(ids)`; the server
 * builds streamed and non-streamed responses from the same deltas, so they always agree.
 */
export class IncrementalDetokenizer {
  readonly #tok: TextTokenizer;
  readonly #ids: number[] = [];
  readonly #keepSpecial: boolean;
  #prefix = 0;
  #read = 0;
  #text = '';

  /** A detokenizer over `tokenizer`; special tokens are dropped unless `keepSpecial`. */
  constructor(tokenizer: TextTokenizer, opts: { readonly keepSpecial?: boolean } = {}) {
    this.#tok = tokenizer;
    this.#keepSpecial = opts.keepSpecial ?? false;
  }

  /** The text released so far. */
  get text(): string {
    return this.#text;
  }

  /** Token ids pushed so far. */
  get ids(): readonly number[] {
    return this.#ids;
  }

  /** Adds one token; returns the text it releases ('' while a sequence is incomplete). */
  push(id: number): string {
    this.#ids.push(id);
    return this.#advance(false);
  }

  /** Releases any held text (at the end of generation); further pushes continue after it. */
  flush(): string {
    return this.#read < this.#ids.length ? this.#advance(true) : '';
  }

  #advance(final: boolean): string {
    const prefixText = this.#tok.decode(this.#ids.slice(this.#prefix, this.#read), this.#keepSpecial);
    const newText = this.#tok.decode(this.#ids.slice(this.#prefix), this.#keepSpecial);
    if (!final && (newText.length <= prefixText.length || newText.endsWith(REPLACEMENT))) {
      // Nothing new yet, or the window ends in an incomplete sequence: hold it back.
      if (newText.length <= prefixText.length && !newText.endsWith(REPLACEMENT) && newText === prefixText) {
        // The token decodes to nothing (a dropped special token): move past it.
        this.#read = this.#ids.length;
      }
      return '';
    }
    const delta = newText.startsWith(prefixText) ? newText.slice(prefixText.length) : newText.slice(Math.min(prefixText.length, newText.length));
    this.#prefix = this.#read;
    this.#read = this.#ids.length;
    this.#text += delta;
    return delta;
  }
}
