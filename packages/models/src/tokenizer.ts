import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import { ModelCode, ModelError } from './errors.js';
import { errorMessage } from '@stageml/ir';

/** Text ↔ token ids through a Hugging Face `tokenizer.json` (via @huggingface/tokenizers). */
export interface TextTokenizer {
  /** Token ids of `text`, with the special tokens the tokenizer's post-processor adds (e.g. BOS). */
  encode(text: string): number[];
  /** Text of `ids`; special tokens are dropped unless `keepSpecial`. */
  decode(ids: readonly number[], keepSpecial?: boolean): string;
}

/**
 * Loads `tokenizer.json` and `tokenizer_config.json` from `dir`. Returns `undefined` when the
 * directory has no tokenizer; a present but unreadable one is `MODEL_IO` or `MODEL_BAD_CONFIG`.
 */
export async function loadTokenizer(dir: string): Promise<TextTokenizer | undefined> {
  let json: string;
  try {
    json = await readFile(join(dir, 'tokenizer.json'), 'utf8');
  } catch (e) {
    if ((e as { code?: string }).code === 'ENOENT') return undefined;
    throw new ModelError(ModelCode.IO, `cannot read ${join(dir, 'tokenizer.json')}: ${errorMessage(e)}`, { cause: e });
  }
  let config: unknown = {};
  try {
    config = JSON.parse(await readFile(join(dir, 'tokenizer_config.json'), 'utf8'));
  } catch (e) {
    if ((e as { code?: string }).code !== 'ENOENT') {
      throw new ModelError(ModelCode.BAD_CONFIG, `${join(dir, 'tokenizer_config.json')}: ${errorMessage(e)}`, { cause: e });
    }
  }
  let tok: Tokenizer;
  try {
    tok = new Tokenizer(JSON.parse(json) as object, config as object);
  } catch (e) {
    throw new ModelError(ModelCode.BAD_CONFIG, `${join(dir, 'tokenizer.json')}: ${errorMessage(e)}`, { cause: e });
  }
  return {
    encode: (text) => tok.encode(text).ids,
    decode: (ids, keepSpecial = false) => tok.decode([...ids], { skip_special_tokens: !keepSpecial }),
  };
}
