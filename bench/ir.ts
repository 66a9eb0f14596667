// Suite `ir`: building, verifying, printing and parsing a Llama-7B-shaped graph (32 layers, hidden
// 4096, 32 heads, 8 kv heads, intermediate 11008, symbolic batch and seq, no weight data).
// Baselines: JSON serialization and deserialization of the same graph, measured in the same run.
import { deserializeGraph, parseGraph, printGraph, serializeGraph, verifyGraph } from '@stageml/ir';
import { LLAMA_7B_GQA_SHAPE, buildLlamaGraph } from '@stageml/models';
import { type BenchCase, medianMs, writeResults } from './lib/harness.js';

const RUNS = Number(process.env['BENCH_RUNS'] ?? 21);
const g = buildLlamaGraph(LLAMA_7B_GQA_SHAPE);
const text = printGraph(g);
const json = serializeGraph(g);

const build = medianMs(() => buildLlamaGraph(LLAMA_7B_GQA_SHAPE), RUNS);
const verify = medianMs(() => { verifyGraph(g); }, RUNS);
const print = medianMs(() => printGraph(g), RUNS);
const parse = medianMs(() => parseGraph(text, { verify: false }), RUNS);
const parseVerify = medianMs(() => parseGraph(text), RUNS);
const toJson = medianMs(() => serializeGraph(g), RUNS);
const fromJson = medianMs(() => deserializeGraph(json), RUNS);

const cases: BenchCase[] = [
  { name: 'build (trace 7B-shaped graph)', medianMs: build, runs: RUNS, budgetMs: 100, extra: { nodes: g.nodes.length } },
  { name: 'verify', medianMs: verify, runs: RUNS, budgetMs: 100 },
  { name: 'print (text form)', medianMs: print, runs: RUNS, baseline: 'serialize JSON', ratio: print / toJson, budgetMs: 100, extra: { bytes: text.length } },
  { name: 'parse (text form, no verify)', medianMs: parse, runs: RUNS, baseline: 'deserialize JSON (verifies)', ratio: parse / fromJson, budgetMs: 100 },
  { name: 'parse + verify', medianMs: parseVerify, runs: RUNS, baseline: 'deserialize JSON (verifies)', ratio: parseVerify / fromJson, budgetMs: 100 },
  { name: 'serialize JSON', medianMs: toJson, runs: RUNS, extra: { bytes: json.length } },
  { name: 'deserialize JSON (+ verify)', medianMs: fromJson, runs: RUNS },
];
writeResults('ir', 'Llama-7B-shaped graph (GQA 32/8 heads, 32 layers, symbolic batch and seq, shapes only): median wall time of each IR step.', cases);
