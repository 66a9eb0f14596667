// The engine's programs are the staging pipeline's output: what Engine.load prepares on the executor
// equals `specialize` (at the `base` cutoff, serving lattice) of the annotated, rewritten model graph.
import { fileURLToPath } from 'node:url';
import { SERVING_STAGES, annotate } from '@stageml/annotations';
import { type Graph, graphToJson } from '@stageml/ir';
import { readLlamaConfig } from '@stageml/models';
import { canonicalRules, rewriteGreedy } from '@stageml/rewrite';
import { type Executor, interpreterExecutor, specialize } from '@stageml/runtime';
import { describe, expect, it } from 'vitest';
import { Engine, engineGraph, servingAnnotations } from './index.js';
import { paramsToInputs } from './graph.js';

const fixtures = fileURLToPath(new URL('../../../fixtures/', import.meta.url));

/** The interpreter, recording every graph it prepares. */
function recording(): { executor: Executor; graphs: Graph[] } {
  const graphs: Graph[] = [];
  return { graphs, executor: { ...interpreterExecutor, prepare: (g, w) => (graphs.push(g), interpreterExecutor.prepare(g, w)) } };
}

describe('Engine programs come out of specialize', () => {
  for (const model of ['peft-tiny/llama/base', 'hf-families/gemma2']) {
    it(`${model}: each prepared program equals specialize's residual of the annotated graph, with its report`, async () => {
      const r = recording();
      const engine = await Engine.load(`${fixtures}${model}`, { executor: r.executor, maxLoras: 2, maxLoraRank: 8 });
      const config = await readLlamaConfig(`${fixtures}${model}`);
      const forms = ['gathered', 'grouped', 'single', 'base'] as const;
      expect(r.graphs).toHaveLength(forms.length);
      for (const [i, form] of forms.entries()) {
        // A tied head as its own input, and no DoRA/bias output tables until an adapter needs them, as Engine.load builds it.
        const g = engineGraph(config, form, 3, 8, [], { separateHead: config.tieWordEmbeddings, outTables: false });
        const ann = annotate(g, SERVING_STAGES, servingAnnotations(g));
        const rw = rewriteGreedy(g, [canonicalRules], { context: { annotations: ann, cutoff: 'base' } }).graph;
        const s = specialize(rw, { annotations: annotate(rw, SERVING_STAGES, servingAnnotations(rw)), cutoff: 'base', shapesOnly: true });
        const weights = new Set(rw.nodes.flatMap((n) => (n.kind === 'param' ? [n.name] : [])));
        const folded = (n: string): string => (weights.has(n) || !(n in s.constantTypes) ? n : `folded.${n}`);
        const want = { ...s.residual, nodes: s.residual.nodes.map((n) => (n.kind === 'param' ? { ...n, name: folded(n.name) } : n)), values: s.residual.values.map((v) => ({ ...v, name: folded(v.name) })) };
        expect(graphToJson(r.graphs[i]!)).toEqual(graphToJson(paramsToInputs(want, (n) => weights.has(n))));
        const report = engine.programReport(form)!;
        expect(report).toMatchObject({ form, cutoff: 'base', lattice: SERVING_STAGES.toString() });
        expect(report.specialize.residualOps).toBe(s.report.residualOps);
        expect(report.specialize.foldedOps).toBe(0); // shapes only: folded values are computed by foldProgram
        expect(report.stages['base']).toBeGreaterThan(0);
        expect(report.stages['token']).toBeGreaterThan(0);
        if (form !== 'base') expect(report.stages['adapter']).toBeGreaterThan(0);
        expect(Object.values(report.residualOps).reduce((a, b) => a + b, 0)).toBe(s.report.residualOps);
      }
      // Gemma's norm scales (1 + w) depend on base weights only: folded, and those weights are no residual input.
      if (model.includes('gemma2')) {
        expect(engine.programReport('base')!.folded.length).toBeGreaterThan(0);
        expect(r.graphs[3]!.nodes.some((n) => n.kind === 'input' && n.name.endsWith('input_layernorm.weight'))).toBe(false);
      }
      engine.dispose();
    }, 120_000);
  }
});
