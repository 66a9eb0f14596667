import { describe, expect, it } from 'vitest';
import { OP_GROUPS, TRAITS, hasTrait, opsWithTrait } from './op-groups.js';
import { OPS, OP_KEYS } from './ops/index.js';

describe('op groups', () => {
  it('are exactly the ops declaring each trait', () => {
    for (const t of TRAITS) {
      expect([...opsWithTrait(t)]).toEqual(OP_GROUPS[t]);
      for (const k of OP_KEYS) expect(hasTrait(k, t), `${k} ${t}`).toBe((OPS[k].traits as readonly string[]).includes(t));
    }
  });

  it('name the contractions, elementwise and shape-only ops the consumers rely on', () => {
    expect(OP_GROUPS.contraction).toEqual(['matmul', 'linear', 'groupedMatmul', 'quantizedLinear', 'loraBank', 'quantizedLoraBank', 'loraLinear', 'loraBankLinear', 'gatheredLoraLinear', 'loraScatterAdd', 'groupedLoraMatmul']);
    expect(OP_GROUPS.elementwise).toEqual(expect.arrayContaining(['add', 'mul', 'exp', 'silu', 'where', 'cast']));
    expect(OP_GROUPS['shape-only']).toEqual(expect.arrayContaining(['reshape', 'transpose']));
  });

  it('cover every trait an op declares', () => {
    for (const k of OP_KEYS) for (const t of OPS[k].traits) expect(TRAITS).toContain(t);
  });
});
