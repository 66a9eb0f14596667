import { fc, test } from '@fast-check/vitest';
import { thrownBy } from '@stageml/testkit';
import { describe, expect } from 'vitest';
import { EXPERT_PROJECTIONS, MOE_PLAN_CHOICES, MoeCode, type MoeModelShape, type MoePlan, MoePlanError, checkMoePlan, moePlanToJson, parseMoePlan } from './index.js';

/** A model with 1–3 MoE layers (E from 1) and 1–3 adapters, each targeting a non-empty set of (layer, projections). */
const arbShape: fc.Arbitrary<MoeModelShape> = fc
  .array(fc.integer({ min: 1, max: 5 }), { minLength: 1, maxLength: 3 })
  .chain((experts) => {
    const layers = experts.map((numExperts, i) => ({ name: `model.layers.${String(i)}.mlp.experts`, numExperts }));
    const target = fc.record({ layer: fc.constantFrom(...layers.map((l) => l.name)), projections: fc.subarray([...EXPERT_PROJECTIONS], { minLength: 1 }) });
    const adapter = fc.uniqueArray(target, { minLength: 1, maxLength: 3, selector: (t) => t.layer });
    return fc.array(adapter, { minLength: 1, maxLength: 3 }).map((targets) => ({ layers, adapters: targets.map((t, i) => ({ name: `adapter-${String(i)}`, targets: t })) }));
  });

/** A valid plan over a random subset of the shape's adapters, with random choices and reasons, units shuffled. */
const arbPlanned: fc.Arbitrary<{ shape: MoeModelShape; plan: MoePlan }> = arbShape.chain((shape) => {
  const units = shape.adapters.flatMap((a) =>
    a.targets.flatMap((t) =>
      t.projections.flatMap((projection) => {
        const E = shape.layers.find((l) => l.name === t.layer)!.numExperts;
        return Array.from({ length: E }, (_, expert) => ({ adapter: a.name, layer: t.layer, projection, expert }));
      }),
    ),
  );
  const chosen = fc.subarray(shape.adapters.map((a) => a.name));
  const choices = fc.array(fc.record({ choice: fc.constantFrom(...MOE_PLAN_CHOICES), reason: fc.option(fc.string({ maxLength: 8 }), { nil: undefined }) }), { minLength: units.length, maxLength: units.length });
  return fc.tuple(chosen, choices, fc.option(fc.string({ maxLength: 12 }), { nil: undefined })).chain(([names, cs, model]) => {
    const planned = units.flatMap((u, i) => (names.includes(u.adapter) ? [{ ...u, choice: cs[i]!.choice, ...(cs[i]!.reason === undefined ? {} : { reason: cs[i]!.reason }) }] : []));
    return fc.shuffledSubarray(planned, { minLength: planned.length, maxLength: planned.length }).map((shuffled) => ({
      shape,
      plan: { format: 'stageml.moe-plan' as const, version: 1 as const, ...(model === undefined ? {} : { model }), units: shuffled },
    }));
  });
});

type Mutation = 'version' | 'format' | 'choice' | 'projection' | 'expert-range' | 'expert-type' | 'duplicate' | 'missing' | 'adapter' | 'layer' | 'field';
const MUTATIONS: readonly Mutation[] = ['version', 'format', 'choice', 'projection', 'expert-range', 'expert-type', 'duplicate', 'missing', 'adapter', 'layer', 'field'];

/** Applies `m` to unit `i` of a JSON copy of the plan; returns the document and the JSON path the error must name. */
function mutate(plan: MoePlan, shape: MoeModelShape, m: Mutation, i: number, junk: string): { doc: Record<string, unknown>; path: string } {
  const doc = JSON.parse(JSON.stringify(plan)) as Record<string, unknown> & { units: Record<string, unknown>[] };
  const u = doc.units[i]!;
  const at = `$.units[${String(i)}]`;
  switch (m) {
    case 'version':
      doc['version'] = junk.length % 2 === 0 ? 2 : '1';
      return { doc, path: '$.version' };
    case 'format':
      doc['format'] = `x${junk}`;
      return { doc, path: '$.format' };
    case 'choice':
      u['choice'] = `merge${junk}`;
      return { doc, path: `${at}.choice` };
    case 'projection':
      u['projection'] = `up_proj${junk}`;
      return { doc, path: `${at}.projection` };
    case 'expert-range':
      u['expert'] = shape.layers.find((l) => l.name === u['layer'])!.numExperts + junk.length;
      return { doc, path: `${at}.expert` };
    case 'expert-type':
      u['expert'] = junk.length % 2 === 0 ? -1 - junk.length : String(u['expert']);
      return { doc, path: `${at}.expert` };
    case 'duplicate':
      doc.units.push({ ...u, choice: 'fallback' });
      return { doc, path: `$.units[${String(doc.units.length - 1)}]` };
    case 'missing':
      doc.units.splice(i, 1);
      return { doc, path: '$.units' };
    case 'adapter':
      u['adapter'] = `unknown-${junk}`;
      return { doc, path: `${at}.adapter` };
    case 'layer':
      u['layer'] = `model.layers.99.${junk}`;
      return { doc, path: `${at}.layer` };
    case 'field':
      u[`x_${junk}`] = 1;
      return { doc, path: `${at}.x_${junk}` };
  }
}

describe('MoE plan JSON', () => {
  test.prop([arbPlanned])('round-trips exactly and validates', ({ shape, plan }) => {
    const text = moePlanToJson(plan, shape);
    const back = parseMoePlan(text, shape);
    expect(back).toEqual(plan);
    expect(moePlanToJson(back)).toBe(text);
    expect(JSON.parse(text)).toEqual(plan);
  });

  test.prop([arbPlanned.filter(({ plan }) => plan.units.length > 0), fc.constantFrom(...MUTATIONS), fc.nat(), fc.stringMatching(/^[a-z0-9]{0,6}$/)])(
    'mutated plans fail validation with MOE_BAD_PLAN naming the entry',
    ({ shape, plan }, m, n, junk) => {
      const i = n % plan.units.length;
      const unit = plan.units[i]!;
      // Removing the only unit of an adapter leaves it unplanned (served by fallback), which is valid.
      if (m === 'missing' && plan.units.filter((u) => u.adapter === unit.adapter).length === 1) {
        const { doc } = mutate(plan, shape, m, i, junk);
        expect(() => checkMoePlan(doc, shape)).not.toThrow();
        return;
      }
      const { doc, path } = mutate(plan, shape, m, i, junk);
      const e = thrownBy(() => checkMoePlan(doc, shape));
      expect(e).toBeInstanceOf(MoePlanError);
      expect(e).toMatchObject({ code: MoeCode.BAD_PLAN, path });
    },
  );

  test.prop([arbPlanned])('printing is independent of the key order of the plan objects', ({ shape, plan }) => {
    const reordered = { units: plan.units.map((u) => Object.fromEntries(Object.entries(u).reverse())), version: plan.version, format: plan.format, ...(plan.model === undefined ? {} : { model: plan.model }) } as unknown as MoePlan;
    expect(moePlanToJson(reordered, shape)).toBe(moePlanToJson(plan, shape));
  });
});
