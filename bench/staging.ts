// Suite `staging`: binding-time analysis and shapes-only specialization of a Llama-7B-shaped graph
// with LoRA (r = 16) on every projection of its 32 layers, adapters at stage `adapter`, tokens at
// `token`, cut at `adapter`. Baseline: verifying the same graph (a single linear pass over it),
// measured in the same run.
import { SERVING_STAGES, analyzeBindingTimes, annotate } from '@stageml/annotations';
import { verifyGraph } from '@stageml/ir';
import { LLAMA_7B_GQA_SHAPE, buildLlamaGraph } from '@stageml/models';
import { specialize } from '@stageml/runtime';
import { type BenchCase, medianMs, writeResults } from './lib/harness.js';

const RUNS = Number(process.env['BENCH_RUNS'] ?? 21);
const g = buildLlamaGraph(LLAMA_7B_GQA_SHAPE, { lora: { rank: 16, scale: 2 } });
const spec = { inputs: { input_ids: 'token', position_ids: 'token' }, params: { '*.lora_A.weight': 'adapter', '*.lora_B.weight': 'adapter' } };

const verify = medianMs(() => { verifyGraph(g); }, RUNS);
const annotateMs = medianMs(() => annotate(g, SERVING_STAGES, spec), RUNS);
const ann = annotate(g, SERVING_STAGES, spec);
const bta = medianMs(() => analyzeBindingTimes(g, ann), RUNS);
const both = medianMs(() => specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: 'adapter', shapesOnly: true }), RUNS);
const r = specialize(g, { lattice: SERVING_STAGES, annotations: spec, cutoff: 'adapter', shapesOnly: true });

const cases: BenchCase[] = [
  { name: 'annotate (globs over 674 params)', medianMs: annotateMs, runs: RUNS, baseline: 'verify', ratio: annotateMs / verify },
  { name: 'binding-time analysis', medianMs: bta, runs: RUNS, baseline: 'verify', ratio: bta / verify },
  {
    name: 'annotate + analysis + specialization (shapes only)',
    medianMs: both,
    runs: RUNS,
    baseline: 'verify',
    ratio: both / verify,
    budgetMs: 50,
    extra: { nodes: g.nodes.length, residualOps: r.report.residualOps, constants: r.report.constants },
  },
  { name: 'verify (baseline)', medianMs: verify, runs: RUNS },
];
writeResults('staging', 'Llama-7B-shaped graph with LoRA r=16 on all 7 projections × 32 layers (shapes only), cut at `adapter`.', cases);
