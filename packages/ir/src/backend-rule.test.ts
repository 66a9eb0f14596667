import { describe, expect, it } from 'vitest';

import { isUnsupportedRule, unsupportedRule } from './index.js';

describe('unsupportedRule', () => {
  it('builds an unsupported entry that isUnsupportedRule recognises', () => {
    const r = unsupportedRule('no kernel');
    expect(r).toEqual({ kind: 'unsupported', reason: 'no kernel' });
    expect(isUnsupportedRule(r)).toBe(true);
  });

  it('rejects lowering functions, lowering entries and non-objects', () => {
    expect(isUnsupportedRule(() => [])).toBe(false);
    expect(isUnsupportedRule({ kind: 'lower', lower: () => [], exact: false })).toBe(false);
    expect(isUnsupportedRule(null)).toBe(false);
    expect(isUnsupportedRule('unsupported')).toBe(false);
  });
});
