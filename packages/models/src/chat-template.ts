import { randomUUID } from 'node:crypto';
import { Template } from '@huggingface/jinja';
import { errorMessage } from '@stageml/ir';
import { ModelCode, ModelError } from './errors.js';
import type { TextTokenizer } from './tokenizer.js';

/** A chat message as chat templates see it (content already a string). */
export interface ChatTemplateMessage {
  readonly role: string;
  readonly content: string;
}

/** Options of `renderChatTemplate` / `applyChatTemplate`. */
export interface ChatTemplateOptions {
  /** Append the assistant turn's opening (`add_generation_prompt`, default true). */
  readonly addGenerationPrompt?: boolean;
  /** A template name from the tokenizer (`default`, `tool_use`, …) or a template's source; default `default`. */
  readonly template?: string;
  /** More variables for the template (`chat_template_kwargs`). */
  readonly variables?: Readonly<Record<string, unknown>>;
}

const compiled = new Map<string, Template>();

function compile(source: string): Template {
  let t = compiled.get(source);
  if (t === undefined) {
    try {
      t = new Template(source);
    } catch (e) {
      throw new ModelError(ModelCode.BAD_CONFIG, `the chat template does not parse: ${errorMessage(e)}`, { cause: e });
    }
    if (compiled.size > 32) compiled.clear();
    compiled.set(source, t);
  }
  return t;
}

/** The template source `opts.template` names on `tokenizer` (a name, else the source itself); `undefined` when it has none. */
export function chatTemplateOf(tokenizer: TextTokenizer, template?: string): string | undefined {
  if (template === undefined) return tokenizer.chatTemplates['default'] ?? Object.values(tokenizer.chatTemplates)[0];
  return tokenizer.chatTemplates[template] ?? (/[{%]/.test(template) ? template : undefined);
}

/**
 * Renders `messages` with a Jinja chat template (a real Jinja implementation, @huggingface/jinja),
 * with the variables transformers passes: `messages`, `add_generation_prompt`, the special tokens
 * (`bos_token`, `eos_token`, …); @huggingface/jinja supplies `raise_exception`.
 */
export function renderChatTemplate(
  source: string,
  messages: readonly ChatTemplateMessage[],
  specialTokens: Readonly<Record<string, string>>,
  opts: ChatTemplateOptions = {},
): string {
  const t = compile(source);
  try {
    return t.render({
      ...specialTokens,
      ...opts.variables,
      messages,
      add_generation_prompt: opts.addGenerationPrompt ?? true,
    });
  } catch (e) {
    throw new ModelError(ModelCode.BAD_OPTIONS, `rendering the chat template failed: ${errorMessage(e)}`, { cause: e });
  }
}

/**
 * `tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`: renders the
 * tokenizer's template and tokenizes the text without adding special tokens again (the template
 * writes `{{ bos_token }}` itself, so there is no second BOS). A tokenizer without a template is
 * `MODEL_BAD_OPTIONS`.
 */
export function applyChatTemplate(tokenizer: TextTokenizer, messages: readonly ChatTemplateMessage[], opts: ChatTemplateOptions = {}): { text: string; ids: number[] } {
  const source = chatTemplateOf(tokenizer, opts.template);
  if (source === undefined) {
    const names = Object.keys(tokenizer.chatTemplates);
    throw new ModelError(ModelCode.BAD_OPTIONS, opts.template === undefined ? 'the tokenizer has no chat template' : `no chat template '${opts.template}' (the tokenizer has: ${names.join(', ') || 'none'})`);
  }
  return encodeChat(tokenizer, source, messages, opts, false);
}

/** The special tokens' strings of `tokenizer`, longest first. */
function specialStrings(tokenizer: TextTokenizer): string[] {
  return [...tokenizer.specialIds].map((id) => tokenizer.tokenOf(id) ?? '').filter((s) => s !== '').sort((a, b) => b.length - a.length);
}

/**
 * Renders and tokenizes a chat so that message content is text: a special token's string written
 * inside a message (`<|im_end|>`, `<|start_header_id|>`) is tokenized as ordinary text, never as
 * the control token (Hugging Face's `split_special_tokens` for the content only); the template's
 * own markers stay special. Content with no special-token string takes the plain path (the same
 * ids as tokenizing the rendered text). Otherwise the chat is rendered a second time with each
 * such content replaced by a random placeholder, which locates the content in the text; a template
 * that changes content (trims it, slices it) so that it cannot be located this way gets the
 * content with those strings removed instead (what transformers' chat sanitization does).
 * `addSpecialTokens` adds the post-processor's tokens (BOS) to the whole.
 */
export function encodeChat(tokenizer: TextTokenizer, source: string, messages: readonly ChatTemplateMessage[], opts: ChatTemplateOptions, addSpecialTokens: boolean): { text: string; ids: number[] } {
  const text = renderChatTemplate(source, messages, tokenizer.specialTokens, opts);
  const specials = specialStrings(tokenizer);
  const marked = messages.map((m) => typeof m.content === 'string' && specials.some((s) => m.content.includes(s)));
  if (!marked.includes(true)) return { text, ids: tokenizer.encode(text, { addSpecialTokens }) };
  const nonce = randomUUID();
  const holder = (i: number): string => `\u{F0000}${nonce}:${String(i)}\u{F0001}`;
  const held = renderChatTemplate(source, messages.map((m, i) => (marked[i] ? { ...m, content: holder(i) } : m)), tokenizer.specialTokens, opts);
  // Put each content back where its placeholder is, noting where it lands.
  const ranges: [number, number][] = [];
  let rebuilt = '';
  const holders = new RegExp(`\u{F0000}${nonce}:(\\d+)\u{F0001}`, 'gu');
  let last = 0;
  for (const m of held.matchAll(holders)) {
    rebuilt += held.slice(last, m.index);
    const content = messages[Number(m[1])]!.content;
    ranges.push([rebuilt.length, rebuilt.length + content.length]);
    rebuilt += content;
    last = m.index + m[0].length;
  }
  rebuilt += held.slice(last);
  if (rebuilt === text) return { text, ids: tokenizer.encode(text, { addSpecialTokens, plainRanges: ranges }) };
  const strip = (content: string): string => {
    let c = content;
    while (specials.some((s) => c.includes(s))) c = specials.reduce((x, s) => x.split(s).join(''), c);
    return c;
  };
  const stripped = messages.map((m, i) => (marked[i] ? { ...m, content: strip(m.content) } : m));
  const clean = renderChatTemplate(source, stripped, tokenizer.specialTokens, opts);
  return { text: clean, ids: tokenizer.encode(clean, { addSpecialTokens }) };
}
