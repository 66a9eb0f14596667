import { Automaton, jsonSchemaGrammar } from '@stageml/structured';
import { describe, expect, it } from 'vitest';
import { hoistSchemaRefs } from './tool-schema.js';
import { toolPlanOf } from './tools.js';

const money = { type: 'object', properties: { amount: { type: 'integer', minimum: 0, maximum: 9 }, currency: { enum: ['EUR', 'USD'] } }, required: ['amount', 'currency'], additionalProperties: false };
const priced = { $defs: { money }, type: 'object', properties: { price: { $ref: '#/$defs/money' } }, required: ['price'], additionalProperties: false };
const tagged = { definitions: { tag: { enum: ['a', 'b'] } }, type: 'object', properties: { tags: { type: 'array', items: { $ref: '#/definitions/tag' }, maxItems: 2 } }, required: ['tags'], additionalProperties: false };
const tools = [
  { type: 'function', function: { name: 'priced', parameters: priced } },
  { type: 'function', function: { name: 'tagged', parameters: tagged } },
];

describe('hoistSchemaRefs', () => {
  it('leaves a schema without references as it is', () => {
    expect(hoistSchemaRefs(money, 't0')).toEqual({ schema: money, defs: {} });
  });

  it("moves a function's definitions under private names and rewrites its references", () => {
    const h = hoistSchemaRefs(priced, 't0');
    expect(h.schema).toEqual({ $ref: '#/$defs/t0' });
    expect(Object.keys(h.defs).sort()).toEqual(['t0', 't0.$defs.money']);
    expect(h.defs['t0']).toMatchObject({ properties: { price: { $ref: '#/$defs/t0.$defs.money' } } });
    expect(h.defs['t0']).not.toHaveProperty('$defs');
  });
});

describe("tool_choice 'required' with functions whose parameters use $defs and definitions", () => {
  it('compiles, and accepts calls of either function while refusing values their definitions exclude', () => {
    const plan = toolPlanOf({ tools, tool_choice: 'required' }, {})!;
    if (plan.spec?.kind !== 'json_schema') throw new Error('expected a json_schema constraint');
    const a = new Automaton(jsonSchemaGrammar(plan.spec.schema, { strict: true }));
    expect(a.matches('[{"name":"priced","parameters":{"price":{"amount":3,"currency":"EUR"}}}]')).toBe(true);
    expect(a.matches('[{"name":"tagged","parameters":{"tags":["a","b"]}},{"name":"priced","parameters":{"price":{"amount":0,"currency":"USD"}}}]')).toBe(true);
    expect(a.matches('[{"name":"priced","parameters":{"price":{"amount":3,"currency":"GBP"}}}]')).toBe(false);
    expect(a.matches('[{"name":"tagged","parameters":{"tags":["c"]}}]')).toBe(false);
  });
});
