import { type TextTokenizer, applyChatTemplate, chatTemplateOf, renderChatTemplate } from '@stageml/models';

/** A chat message. */
export interface ChatMessage {
  readonly role: string;
  readonly content: string;
}

/**
 * Renders chat messages to a prompt: a Jinja `chat_template` when given (with
 * `add_generation_prompt`), else a plain `role: content` transcript ending with `assistant:`.
 */
export function renderChat(messages: readonly ChatMessage[], template: string | undefined, special: Readonly<Record<string, string>>): string {
  if (template !== undefined) return renderChatTemplate(template, messages, special, { addGenerationPrompt: true });
  return `${messages.map((m) => `${m.role}: ${m.content}`).join('\n')}\nassistant:`;
}

/**
 * Prompt ids of a chat, as vLLM builds them: the tokenizer's chat template (`chat_template.jinja`
 * or `tokenizer_config.json`) rendered and tokenized without adding special tokens again, so a
 * template that writes `{{ bos_token }}` yields one BOS. A tokenizer without a template gets the
 * plain transcript of `renderChat`, tokenized with its special tokens. Either way message content
 * is text: a special token's string inside a message is not that token (`encodeChat`). `template` (a request's
 * `chat_template`: a template's source or a name of the tokenizer's) replaces the default.
 */
export function chatPromptIds(
  tokenizer: TextTokenizer,
  messages: readonly ChatMessage[],
  opts: { readonly addGenerationPrompt?: boolean; readonly variables?: Readonly<Record<string, unknown>>; readonly template?: string | undefined } = {},
): number[] {
  if (chatTemplateOf(tokenizer, opts.template) !== undefined || opts.template !== undefined) {
    return applyChatTemplate(tokenizer, messages, {
      addGenerationPrompt: opts.addGenerationPrompt ?? true,
      ...(opts.variables === undefined ? {} : { variables: opts.variables }),
      ...(opts.template === undefined ? {} : { template: opts.template }),
    }).ids;
  }
  return transcriptIds(tokenizer, messages);
}

/**
 * Ids of the plain `role: content` transcript with the tokenizer's special tokens (BOS) added; the
 * transcript has no markers of its own, so all of its text is read as text (a special token's
 * string in a message is not the special token).
 */
export function transcriptIds(tokenizer: TextTokenizer, messages: readonly ChatMessage[]): number[] {
  const text = renderChat(messages, undefined, tokenizer.specialTokens);
  return tokenizer.encode(text, { plainRanges: [[0, text.length]] });
}
