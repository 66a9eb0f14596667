import { describe, expect, it } from 'vitest';
import { ToolDeltaStream, toolChoiceOf, toolPlanOf } from './tools.js';

const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'] } } }];

describe('toolPlanOf', () => {
  it('needs both auto flags for auto, naming them', () => {
    expect(() => toolPlanOf({ tools }, {})).toThrow(/--enable-auto-tool-choice and --tool-call-parser/);
    expect(() => toolPlanOf({ tools, tool_choice: 'auto' }, { enableAutoToolChoice: true })).toThrow(/--tool-call-parser/);
    expect(toolPlanOf({ tools }, { enableAutoToolChoice: true, toolCallParser: 'mistral' })).toMatchObject({ mode: 'auto', parser: 'mistral' });
  });

  it('none ignores tools; named and required constrain to schemas', () => {
    expect(toolPlanOf({ tools, tool_choice: 'none' }, {})).toEqual({ mode: 'none' });
    expect(toolPlanOf({ tools, tool_choice: { type: 'function', function: { name: 'f' } } }, {})?.spec).toEqual({ kind: 'json_schema', schema: tools[0]!.function.parameters, strict: true });
    const req = toolPlanOf({ tools, tool_choice: 'required', parallel_tool_calls: false }, {});
    expect(req?.spec).toMatchObject({ kind: 'json_schema', schema: { type: 'array', minItems: 1, maxItems: 1 } });
    expect(toolPlanOf({ tool_choice: 'none' }, {})).toBeUndefined();
  });

  it('refuses an unknown named tool, a malformed choice and malformed tools', () => {
    expect(() => toolPlanOf({ tools, tool_choice: { type: 'function', function: { name: 'g' } } }, {})).toThrow(/'g' is not one of the given tools/);
    expect(() => toolPlanOf({ tools, tool_choice: 'sometimes' }, {})).toThrow(/'tool_choice'/);
    expect(() => toolPlanOf({ tools: [{ type: 'function', function: {} }], tool_choice: 'required' }, {})).toThrow(/tools\[0\]\.function\.name/);
    expect(() => toolPlanOf({ tool_choice: 'required' }, {})).toThrow(/needs 'tools'/);
  });
});

describe('toolChoiceOf and ToolDeltaStream', () => {
  it('renders required output as OpenAI calls with finish_reason tool_calls', () => {
    const plan = toolPlanOf({ tools, tool_choice: 'required' }, {})!;
    const { message, finishReason } = toolChoiceOf(plan, '[{"name":"f","parameters":{"a":1}}]', 'stop');
    expect(finishReason).toBe('tool_calls');
    expect(message).toMatchObject({ role: 'assistant', content: null, tool_calls: [{ type: 'function', function: { name: 'f', arguments: '{"a":1}' } }] });
    expect(toolChoiceOf(plan, '[{"name":"f","para', 'length')).toEqual({ message: { role: 'assistant', content: '[{"name":"f","para' }, finishReason: 'length' });
  });

  it('streams auto content before a hermes call, then the call whole', () => {
    const s = new ToolDeltaStream(toolPlanOf({ tools }, { enableAutoToolChoice: true, toolCallParser: 'hermes' })!);
    const out = ['Sure. <tool', '_call>{"name": "f", ', '"arguments": {"a": 2}}</tool_call>'].flatMap((d) => s.push(d));
    expect(out).toEqual([{ content: 'Sure. ' }]);
    const end = s.finish('stop');
    expect(end.finishReason).toBe('tool_calls');
    expect(end.deltas).toMatchObject([{ tool_calls: [{ index: 0, type: 'function', function: { name: 'f', arguments: '{"a":2}' } }] }]);
  });
});
