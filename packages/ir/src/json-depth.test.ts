import { describe, expect, it } from 'vitest';
import { jsonDepth } from './json-depth.js';

describe('jsonDepth', () => {
  it('counts nesting outside strings, in linear time', () => {
    expect(jsonDepth('1')).toBe(0);
    expect(jsonDepth('{"a": [1, {"b": []}]}')).toBe(4);
    expect(jsonDepth('{"a": "[[[{{{\\"]]]"}')).toBe(1);
    expect(jsonDepth(`${'['.repeat(100_000)}${']'.repeat(100_000)}`)).toBe(100_000);
  });
});
