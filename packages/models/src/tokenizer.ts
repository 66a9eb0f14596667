import { readFile, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { ModelCode, ModelError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/** Text ↔ token ids through a Hugging Face `tokenizer.json` (via @huggingface/tokenizers). */
export interface TextTokenizer {
  /**
   * Token ids of `text`. By default with the special tokens the tokenizer's post-processor adds
   * (e.g. BOS), as HF `tokenizer(text)`; `addSpecialTokens: false` adds none, as
   * `apply_chat_template` tokenizes a rendered chat (no second BOS).
   */
  encode(text: string, opts?: { readonly addSpecialTokens?: boolean }): number[];
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
  return {
    encode: (text, opts) => tok.encode(text, { add_special_tokens: opts?.addSpecialTokens ?? true }).ids,
    decode: (ids, keepSpecial = false) => (ids.length === 0 ? '' : tok.decode([...ids], { skip_special_tokens: !keepSpecial })),
    tokenOf: (id) => tok.id_to_token(id),
    specialIds,
    specialTokens,
    chatTemplates,
  };
}
