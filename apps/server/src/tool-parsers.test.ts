import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { type ToolParserName, ToolCallStream, toolCallId, toolParsers } from './tool-parsers.js';

interface Case {
  readonly parser: ToolParserName;
  readonly name: string;
  readonly output: string;
  readonly content: string | null;
  readonly calls: readonly { name: string; arguments: unknown }[];
}
const cases = (JSON.parse(readFileSync(fileURLToPath(new URL('../../../fixtures/tool-calls/outputs.json', import.meta.url)), 'utf8')) as { cases: Case[] }).cases;

describe('tool parsers on recorded outputs', () => {
  it.each(cases.map((c) => [`${c.parser}: ${c.name}`, c] as const))('%s', (_, c) => {
    const parsed = toolParsers[c.parser](c.output);
    expect(parsed.content).toBe(c.content);
    expect(parsed.calls.map((k) => ({ name: k.name, arguments: JSON.parse(k.arguments) as unknown }))).toEqual(c.calls);
  });

  it.each(cases.map((c) => [`${c.parser}: ${c.name}`, c] as const))('streamed in 3-character deltas: %s', (_, c) => {
    const s = new ToolCallStream(c.parser);
    let content = '';
    for (let i = 0; i < c.output.length; i += 3) content += s.push(c.output.slice(i, i + 3));
    const end = s.finish();
    content += end.content;
    expect(end.calls.map((k) => ({ name: k.name, arguments: JSON.parse(k.arguments) as unknown }))).toEqual(c.calls);
    // The content streamed is the parsed content (a call's text is never streamed as content).
    expect(content.trim() === '' ? null : content).toBe(c.content);
  });

  it('leaves malformed calls as content', () => {
    expect(toolParsers.hermes('<tool_call>{"name": oops}</tool_call>')).toEqual({ content: '<tool_call>{"name": oops}</tool_call>', calls: [] });
    expect(toolParsers.llama3_json('{"nom": "x"}').calls).toEqual([]);
    expect(toolParsers.mistral('[TOOL_CALLS]bad name[ARGS]{').calls).toEqual([]);
  });

  it('makes OpenAI-style ids, nine alphanumerics for mistral', () => {
    expect(toolCallId()).toMatch(/^chatcmpl-tool-[0-9a-f]{32}$/);
    expect(toolCallId('mistral')).toMatch(/^[A-Za-z0-9]{9}$/);
  });
});
