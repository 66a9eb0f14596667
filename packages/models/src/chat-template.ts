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
  const text = renderChatTemplate(source, messages, tokenizer.specialTokens, opts);
  return { text, ids: tokenizer.encode(text, { addSpecialTokens: false }) };
}
