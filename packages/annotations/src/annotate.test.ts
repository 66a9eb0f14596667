import { GraphBuilder } from '@stageml/ir';
import { expectCode } from '@stageml/testkit';
import { describe, expect, it } from 'vitest';
import { SERVING_STAGES, StageLattice, TWO_STAGE, annotate, defineLattice } from './index.js';

function graph() {
  const b = new GraphBuilder('g');
  const x = b.input('x', ['f32', ['batch', 4]]);
  const cache = b.input('kv_cache', ['f32', ['batch', 4]]);
  const w = b.param('layers.0.q.weight', ['f32', [4, 4]]);
  const a = b.param('layers.0.q.lora_A.weight', ['f32', [2, 4]]);
  const bb = b.param('layers.0.q.lora_B.weight', ['f32', [4, 2]]);
  b.output('y', b.add(b.add(b.linear(x, w), b.linear(b.linear(x, a), bb)), cache));
  return b.build();
}

describe('StageLattice', () => {
  it('orders stages and joins to the later one', () => {
    expect(SERVING_STAGES.toString()).toBe('base < adapter < tenant < request < routing < token');
    expect(SERVING_STAGES.join(SERVING_STAGES.index('tenant'), SERVING_STAGES.index('adapter'))).toBe(SERVING_STAGES.index('tenant'));
    expect(TWO_STAGE.leq(TWO_STAGE.index('static'), TWO_STAGE.index('dynamic'))).toBe(true);
  });

  it('rejects unknown stage names instead of treating them as static', () => {
    expectCode(() => TWO_STAGE.index('stage1'), 'BTA_UNKNOWN_STAGE');
  });

  it('rejects empty, duplicate and malformed chains', () => {
    expectCode(() => defineLattice([]), 'BTA_BAD_LATTICE');
    expectCode(() => defineLattice(['a', 'a']), 'BTA_BAD_LATTICE');
    expectCode(() => new StageLattice(['ok', 'not ok']), 'BTA_BAD_LATTICE');
  });
});

describe('annotate', () => {
  it('defaults parameters to the first stage and inputs to the last', () => {
    const ann = annotate(graph(), SERVING_STAGES);
    expect(ann.stages.get('layers.0.q.weight')).toBe(0);
    expect(ann.stages.get('x')).toBe(SERVING_STAGES.top);
  });

  it('takes exact names and globs, exact names winning over globs', () => {
    const ann = annotate(graph(), SERVING_STAGES, {
      inputs: { x: 'request', kv_cache: 'token' },
      params: { '*.lora_*.weight': 'adapter', 'layers.0.q.lora_B.weight': 'tenant' },
    });
    expect(SERVING_STAGES.name(ann.stages.get('layers.0.q.lora_A.weight')!)).toBe('adapter');
    expect(SERVING_STAGES.name(ann.stages.get('layers.0.q.lora_B.weight')!)).toBe('tenant');
    expect(SERVING_STAGES.name(ann.stages.get('x')!)).toBe('request');
  });

  it('rejects names and patterns that match nothing, with a suggestion', () => {
    const e = expectCode(() => annotate(graph(), SERVING_STAGES, { params: { 'layers.0.q.lora_a.weight': 'adapter' } }), 'BTA_UNKNOWN_NAME');
    expect(e.hint).toContain('layers.0.q.lora_A.weight');
    expectCode(() => annotate(graph(), SERVING_STAGES, { params: { 'decoder.*': 'adapter' } }), 'BTA_UNKNOWN_NAME');
    expectCode(() => annotate(graph(), SERVING_STAGES, { inputs: { 'layers.0.q.weight': 'base' } }), 'BTA_UNKNOWN_NAME');
  });

  it('rejects unknown stages and conflicting patterns', () => {
    expectCode(() => annotate(graph(), SERVING_STAGES, { inputs: { x: 'dynamic' } }), 'BTA_UNKNOWN_STAGE');
    expectCode(() => annotate(graph(), SERVING_STAGES, { defaultParam: 'static' }), 'BTA_UNKNOWN_STAGE');
    expectCode(() => annotate(graph(), SERVING_STAGES, { params: { '*.lora_A.*': 'adapter', 'layers.*.lora_A.weight': 'tenant' } }), 'BTA_CONFLICT');
  });
});
