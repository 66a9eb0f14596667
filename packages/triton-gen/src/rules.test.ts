import { OP_KEYS, OPS } from '@stageml/ir';
import { describe, expect, it } from 'vitest';
import { hostReason, tritonRules } from './rules.js';

describe('tritonRules', () => {
  it('has a rule with a reason for every registry op', () => {
    expect(Object.keys(tritonRules).sort()).toEqual([...OP_KEYS].sort());
    for (const k of OP_KEYS) expect(hostReason(k).length, OPS[k].name).toBeGreaterThan(10);
  });

  it('names only patterns that exist', () => {
    const kinds = new Set(['loraLinear', 'bankGrouped', 'bankGathered', 'moeLora']);
    for (const r of Object.values(tritonRules)) if (r.kind === 'kernel') for (const p of r.patterns) expect(kinds).toContain(p);
  });
});
