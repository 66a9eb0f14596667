import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { ModelCode, ModelError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/** Options of {@link TextTokenizer.encode}. */
export interface EncodeOptions {
  /** Add the post-processor's special tokens (BOS, …); default true. */
  readonly addSpecialTokens?: boolean;
  /**
   * Character ranges `[start, end)` of `text` read as plain text: a special token's string inside
   * them is tokenized as ordinary text (Hugging Face's `split_special_tokens`), outside them as the
   * special token. `[[0, text.length]]` reads the whole text as text. Chat templates use it for
   * message content: a user cannot write a role marker.
   */
  readonly plainRanges?: readonly (readonly [number, number])[];
}

/** Text ↔ token ids through a Hugging Face `tokenizer.json` (via @huggingface/tokenizers). */
export interface TextTokenizer {
  /**
   * Token ids of `text`. By default with the special tokens the tokenizer's post-processor adds
   * (e.g. BOS), as HF `tokenizer(text)`; `addSpecialTokens: false` adds none, as
   * `apply_chat_template` tokenizes a rendered chat (no second BOS).
   */
  encode(text: string, opts?: EncodeOptions): number[];
  /** Text of `ids`; special tokens are dropped unless `keepSpecial`. */
  decode(ids: readonly number[], keepSpecial?: boolean): string;
  /** The vocabulary string of one id (`Ġthe`, `<0xE4>`), or `undefined` outside the vocabulary. */
  tokenOf(id: number): string | undefined;
  /** Ids of special tokens (dropped by `decode` unless kept). */
  readonly specialIds: ReadonlySet<number>;
  /** Special token strings from `tokenizer_config.json` (`bos_token`, `eos_token`, …), for chat templates. */
  readonly specialTokens: Readonly<Record<string, string>>;
  /**
   * Chat templates by name: `default` from `chat_template.jinja` or `tokenizer_config.json`
   * (`chat_template` as a string, or a list of `{name, template}`), others from the list or from
   * `additional_chat_templates/<name>.jinja`. Empty when the tokenizer has none.
   */
  readonly chatTemplates: Readonly<Record<string, string>>;
}

async function readOptional(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT' || (e as { code?: string }).code === 'ENOTDIR') return undefined;
    throw new ModelError(ModelCode.IO, `cannot read ${path}: ${errorMessage(e)}`, { cause: e });
  }
}

/** A special token as `tokenizer_config.json` writes it: a string, or `{content: …}` (older transformers). */
function tokenString(v: unknown): string | undefined {
  if (typeof v === 'string') return v;
  if (typeof v === 'object' && v !== null && typeof (v as { content?: unknown }).content === 'string') return (v as { content: string }).content;
  return undefined;
}

/**
 * Chat templates of a tokenizer directory, as transformers 5 resolves them: `chat_template.jinja`
 * first, then `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates),
 * plus `additional_chat_templates/*.jinja`. Malformed entries are `MODEL_BAD_CONFIG`.
 */
export async function loadChatTemplates(dir: string, config: Readonly<Record<string, unknown>>): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const file = join(dir, 'tokenizer_config.json');
  const tc = config['chat_template'];
  if (typeof tc === 'string') out['default'] = tc;
  else if (Array.isArray(tc)) {
    for (const [i, t] of tc.entries()) {
      const e = t as { name?: unknown; template?: unknown };
      if (typeof e.name !== 'string' || typeof e.template !== 'string') {
        throw new ModelError(ModelCode.BAD_CONFIG, `${file}: chat_template[${String(i)}] must be {name: string, template: string}`);
      }
      out[e.name] = e.template;
    }
  } else if (tc !== undefined && tc !== null) throw new ModelError(ModelCode.BAD_CONFIG, `${file}: chat_template must be a string or a list of {name, template}`);
  const jinja = await readOptional(join(dir, 'chat_template.jinja'));
  if (jinja !== undefined) out['default'] = jinja;
  let extra: string[] = [];
  try {
    extra = (await readdir(join(dir, 'additional_chat_templates'))).filter((f) => f.endsWith('.jinja')).sort();
  } catch {
    // No additional templates.
  }
  for (const f of extra) out[f.slice(0, -'.jinja'.length)] = (await readOptional(join(dir, 'additional_chat_templates', f))) ?? '';
  return out;
}

/**
 * Loads `tokenizer.json`, `tokenizer_config.json` and the chat templates from `dir`. Returns
 * `undefined` when the directory has no tokenizer; a present but unreadable one is `MODEL_IO` or
 * `MODEL_BAD_CONFIG`.
 */
export async function loadTokenizer(dir: string): Promise<TextTokenizer | undefined> {
  const json = await readOptional(join(dir, 'tokenizer.json'));
  if (json === undefined) return undefined;
  let config: Record<string, unknown> = {};
  const configText = await readOptional(join(dir, 'tokenizer_config.json'));
  if (configText !== undefined) {
    try {
      config = JSON.parse(configText) as Record<string, unknown>;
    } catch (e) {
      throw new ModelError(ModelCode.BAD_CONFIG, `${join(dir, 'tokenizer_config.json')}: ${errorMessage(e)}`, { cause: e });
    }
  }
  let tok: Tokenizer;
  try {
    tok = new Tokenizer(JSON.parse(json) as object, config);
  } catch (e) {
    throw new ModelError(ModelCode.BAD_CONFIG, `${join(dir, 'tokenizer.json')}: ${errorMessage(e)}`, { cause: e });
  }
  const specialTokens: Record<string, string> = {};
  for (const k of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
    const s = tokenString(config[k]);
    if (s !== undefined) specialTokens[k] = s;
  }
  const specialIds = new Set([...tok.get_added_tokens_decoder()].filter(([, t]) => t.special).map(([id]) => id));
  const chatTemplates = await loadChatTemplates(dir, config);
  const splitting = specialSplitter(JSON.parse(json) as { added_tokens?: { content: string; special?: boolean }[] }, config, tok);
  return {
    encode: (text, opts) => {
      const add = opts?.addSpecialTokens ?? true;
      const ranges = opts?.plainRanges ?? [];
      return ranges.length === 0 ? tok.encode(text, { add_special_tokens: add }).ids : splitting(text, ranges, add);
    },
    decode: (ids, keepSpecial = false) => (ids.length === 0 ? '' : tok.decode([...ids], { skip_special_tokens: !keepSpecial })),
    tokenOf: (id) => tok.id_to_token(id),
    specialIds,
    specialTokens,
    chatTemplates,
  };
}

/** A special token's string at `at` in `text`, the longest of `specials` (undefined: none starts there). */
function specialAt(text: string, at: number, specials: readonly string[]): string | undefined {
  for (const s of specials) if (text.startsWith(s, at)) return s;
  return undefined;
}

/**
 * `encode` with plain ranges: special-token strings outside the ranges are the special tokens,
 * the text between them (ranges included) is tokenized by a second tokenizer that has no special
 * added tokens (non-special added tokens still match, as `split_special_tokens` does), and the
 * post-processor adds its tokens to the whole. The second tokenizer is built on first use.
 */
function specialSplitter(
  json: { added_tokens?: { content: string; special?: boolean }[] },
  config: Record<string, unknown>,
  tok: Tokenizer,
): (text: string, ranges: readonly (readonly [number, number])[], add: boolean) => number[] {
  const specials = (json.added_tokens ?? []).filter((t) => t.special === true).map((t) => t.content).filter((c) => c !== '').sort((a, b) => b.length - a.length);
  let plain: Tokenizer | undefined;
  return (text, ranges, add) => {
    plain ??= new Tokenizer({ ...json, added_tokens: (json.added_tokens ?? []).filter((t) => t.special !== true) }, config);
    const inRange = (at: number, end: number): boolean => ranges.some(([a, b]) => at < b && end > a);
    const tokens: string[] = [];
    let from = 0;
    const flush = (to: number): void => {
      if (to > from) tokens.push(...plain!.tokenize(text.slice(from, to), { add_special_tokens: false }));
    };
    for (let at = 0; at < text.length; ) {
      const s = specialAt(text, at, specials);
      if (s === undefined || inRange(at, at + s.length)) {
        at++;
        continue;
      }
      flush(at);
      tokens.push(s);
      at += s.length;
      from = at;
    }
    flush(text.length);
    const out = add && tok.post_processor !== null ? tok.post_processor.post_process(tokens, null, true).tokens : tokens;
    const added = new Map([...tok.get_added_tokens_decoder()].map(([id, t]) => [t.content, id]));
    return out.map((t) => {
      const id = added.get(t) ?? tok.token_to_id(t) ?? tok.model?.unk_token_id;
      if (id === undefined) throw new ModelError(ModelCode.BAD_CONFIG, `the tokenizer produced the token ${JSON.stringify(t)}, which has no id and no unk_token`);
      return id;
    });
  };
}
