import { Template } from '@huggingface/jinja';

/** A chat message. */
export interface ChatMessage {
  readonly role: string;
  readonly content: string;
}

/**
 * Renders chat messages to a prompt: the tokenizer's Jinja `chat_template` when it has one (with
 * `add_generation_prompt`), else a plain `role: content` transcript ending with `assistant:`.
 */
export function renderChat(messages: readonly ChatMessage[], template: string | undefined, special: { bos_token?: string; eos_token?: string }): string {
  if (template !== undefined) {
    return new Template(template).render({ messages, add_generation_prompt: true, bos_token: special.bos_token ?? '', eos_token: special.eos_token ?? '' });
  }
  return `${messages.map((m) => `${m.role}: ${m.content}`).join('\n')}\nassistant:`;
}
