// The engine's `loraBank` ops on the torch worker's kernel step (native/stageml_torch/bank.py):
// real engine programs (engineGraph, cast as Engine.load does for bf16 with adapterDtype same, which
// keeps each projection's `loraBank` op) prepared in the CPU torch executor with
// STAGEML_TORCH_FUSE=1 give every projection's op with its base linear to the kernel step (layers ×
// 7 per program) and give the table entries' outputs (STAGEML_TORCH_FUSE=0; on the CPU the bank
// kernel declines and the step runs the linear and the op's ops); rows of slot 0 or mask 0 give the
// base program's; through a stand-in bank kernel every projection reaches it with the right
// per-row slots. The PEFT-exact f32 factors arrive decomposed (no `loraBank` op) and stay so.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type Graph, type HostTensor, graphParams, graphToJson, hostTensor, seededRandom } from '@stageml/ir';
import { type LlamaConfig, parseLlamaConfig } from '@stageml/models';
import { type TorchExecutor, createTorchExecutor } from '@stageml/runtime';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { type EngineAdapterDType, castEngineGraph } from './dtype.js';
import { engineGraph, paramsToInputs } from './graph.js';
import { describeWithTorch } from './test-support.js';

const LAYERS = 2;
const SLOTS = 4;
const RANK = 16;
const cfg: LlamaConfig = parseLlamaConfig(
  JSON.stringify({ architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: 32, intermediate_size: 64, num_hidden_layers: LAYERS, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, vocab_size: 50, rms_norm_eps: 1e-5, rope_theta: 10000, max_position_embeddings: 128, tie_word_embeddings: false }),
  'config.json',
);

/** The engine's program of `form` at bf16, as Engine.load prepares it (castProgram, weights as inputs). */
function program(form: 'gathered' | 'single' | 'grouped' | 'base', adapterDtype: EngineAdapterDType = 'same'): Graph {
  const g = castEngineGraph(engineGraph(cfg, form, SLOTS, RANK, []), 'bf16', { adapterDtype, isFactorInput: (n) => n.startsWith('slots.'), maskInputs: new Set(['attention_mask']), dtypeInputs: (n) => n.startsWith('past_'), dtypeOutputs: (n) => n.startsWith('new_') });
  return paramsToInputs(g);
}

const rand = seededRandom(7);
const uniform = (dtype: 'bf16' | 'f32', shape: number[], scale: number): HostTensor => hostTensor(dtype, shape, Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => (rand() * 2 - 1) * scale));

/** Weights (the base program's parameters, fed as inputs) and slot tables: slot 0 zeros, slot j of rank 8·j (≤ R). */
const weights: Record<string, HostTensor> = {};
const base32 = engineGraph(cfg, 'base', SLOTS, RANK, []);
for (const p of graphParams(base32)) {
  const s = base32.values[p.results[0]!]!.type.shape as number[];
  weights[p.name] = s.length === 1 ? hostTensor('bf16', s, new Array<number>(s[0]!).fill(1)) : uniform('bf16', s, 1 / Math.sqrt(s[s.length - 1]!));
}

function tables(g: Graph): Record<string, HostTensor> {
  const out: Record<string, HostTensor> = {};
  for (const n of g.nodes) {
    if (n.kind !== 'input' || !n.name.startsWith('slots.')) continue;
    const shape = g.values[n.results[0]!]!.type.shape as number[];
    if (shape.length === 2) {
      // The output tables (LoRA bias, DoRA scale): every slot but the base slot 0 non-zero.
      const t = uniform('bf16', shape, 0.3);
      t.data.fill(0, 0, shape[1]);
      out[n.name] = t;
      continue;
    }
    const [s, r, d] = shape;
    const t = uniform('bf16', [s!, r!, d!], 0.3);
    for (let j = 0; j < s!; j++) for (let k = Math.min(8 * j, r!); k < r!; k++) t.data.fill(0, (j * r! + k) * d!, (j * r! + k + 1) * d!);
    out[n.name] = t;
  }
  return out;
}

const pasts = new Map<string, HostTensor>();
/** The cached keys/values of a shape: the same for every program of the test (drawn once). */
function pastCache(name: string, shape: number[]): HostTensor {
  const key = `${name}:${shape.join(',')}`;
  let t = pasts.get(key);
  if (t === undefined) pasts.set(key, (t = uniform('bf16', shape, 0.5)));
  return t;
}

/** A step's inputs: `batch` rows of `seq` new tokens after `past` cached ones. */
function stepInputs(g: Graph, batch: number, seq: number, past: number, slots: Record<string, HostTensor>, extra: Record<string, HostTensor>): Record<string, HostTensor> {
  const dims: Record<string, number> = { batch, seq, past, groups: 2 };
  const dim = (d: number | string): number => (typeof d === 'number' ? d : d.split('+').reduce((a, t) => a + dims[t.trim()]!, 0));
  const out: Record<string, HostTensor> = {};
  for (const n of graphToJson(g).nodes) {
    if (n.kind !== 'input') continue;
    const name = n.results[0]!.name;
    const shape = n.results[0]!.type.shape.map(dim);
    const size = shape.reduce((a, b) => a * b, 1);
    if (name in weights) out[name] = weights[name]!;
    else if (name in slots) out[name] = slots[name]!;
    else if (name in extra) out[name] = extra[name]!;
    else if (name === 'input_ids') out[name] = hostTensor('i64', shape, Array.from({ length: size }, (_, i) => (i * 7 + 3) % cfg.vocabSize));
    else if (name === 'position_ids') out[name] = hostTensor('i64', shape, Array.from({ length: size }, (_, i) => past + (i % seq)));
    else if (name === 'attention_mask') out[name] = hostTensor('f32', shape, new Array<number>(size).fill(0));
    else if (name.startsWith('past_')) out[name] = pastCache(name, shape);
    else throw new Error(`no test rule for input ${name}`);
  }
  return out;
}

const rows = (t: HostTensor, which: number[]): number[] => {
  const w = t.shape.slice(1).reduce((a, b) => a * b, 1);
  return which.flatMap((r) => Array.from(t.data.subarray(r * w, (r + 1) * w)));
};

describeWithTorch("the engine's slot linears fused on the torch worker (CPU torch, STAGEML_TORCH_FUSE=1)", () => {
  let fused: TorchExecutor;
  let plain: TorchExecutor;
  beforeAll(async () => {
    fused = await createTorchExecutor({ device: 'cpu', env: { STAGEML_TORCH_FUSE: '1' } });
    plain = await createTorchExecutor({ device: 'cpu', env: { STAGEML_TORCH_FUSE: '0' } });
  }, 120_000);
  afterAll(async () => {
    await fused.close();
    await plain.close();
  });

  for (const form of ['gathered', 'single', 'grouped'] as const) {
    it(`${form}: every projection's slot linear is replaced, outputs equal the unfused program's, base rows the base program's`, async () => {
      const g = program(form);
      const p = await fused.prepare(g);
      const u = await plain.prepare(g);
      const base = await fused.prepare(program('base'));
      expect(p.fused.slotLinears).toBe(LAYERS * 7);
      // q, k and v; gate and up
      expect(p.fused.slotSets).toBe(LAYERS * 2);
      // Each layer's keys and values appended to the resident cache in place (kv-append.test.ts).
      expect(p.fused.cacheConcats).toBe(LAYERS * 2);
      expect(base.fused.cacheConcats).toBe(LAYERS * 2);
      expect(u.fused.slotLinears).toBe(0);
      expect(base.fused.slotLinears).toBe(0);
      const slots = tables(g);
      // Decode (3 rows, seq 1) and a chunk of 2 tokens per row (seq repetition of each row's slot).
      for (const [batch, seq] of [
        [3, 1],
        [3, 2],
      ] as const) {
        const extra: Record<string, HostTensor> =
          form === 'gathered'
            ? { row_slot: hostTensor('i64', [batch], [2, 0, 1]) }
            : form === 'single'
              ? { one_slot: hostTensor('i64', [], [2]), row_mask: hostTensor('f32', [batch, 1, 1], [1, 0, 1]) }
              : { group_slot: hostTensor('i64', [2], [2, 1]), row_group: hostTensor('f32', [batch, 2], [1, 0, 0, 0, 0, 1]) };
        const ins = stepInputs(g, batch, seq, 4, slots, extra);
        const [a, b, c] = await Promise.all([p.run(ins), u.run(ins), base.run(stepInputs(program('base'), batch, seq, 4, {}, {}))]);
        for (const name of Object.keys(b)) expect(a[name], name).toBeAllclose(b[name]!, { rtol: 1e-2, atol: 1e-2 });
        // Row 1 is a base row in every form (slot 0; mask 0; no group); rows 0 and 2 carry an adapter.
        expect(rows(a['logits']!, [1])).toEqual(rows(c['logits']!, [1]));
        expect(rows(a['logits']!, [0])).not.toEqual(rows(c['logits']!, [0]));
      }
      p.dispose();
      u.dispose();
      base.dispose();
    }, 120_000);
  }

  it('sends every slot linear of a real program to the bank kernel (stand-ins; q, k, v and gate, up as sets), within bf16 tolerance of the unfused program', () => {
    const dir = mkdtempSync(join(tmpdir(), 'torch-bank-'));
    const files = Object.fromEntries(
      (['gathered', 'single', 'grouped'] as const).map((f) => {
        const file = join(dir, `${f}.json`);
        writeFileSync(file, JSON.stringify(graphToJson(program(f))));
        return [f, file];
      }),
    );
    const python = [process.env['STAGEML_PYTHON'], 'python3', '/usr/bin/python3'].find((c) => c !== undefined && c !== '' && spawnSync(c, ['-c', 'import torch']).status === 0)!;
    const code = `
import json, os, sys
import torch
from stageml_torch import bank, stream
from stageml_torch.graph import Program
calls = []
def fake(x, w, a_bank, b_bank, slots, ranks, scales, cfg=None, out=None, b_bank_t=None):
    calls.append(slots.tolist())
    return bank.reference_bank_linear(x, w, a_bank, b_bank, slots, ranks, scales)
sets = []
def fake_set(x, items, slots):
    sets.append(len(items))
    return [bank.reference_bank_linear(x, w, a, b, slots, r, s) for w, a, b, r, s, bt in items]
stream.lora_bank_linear, stream.lora_bank_linear_set, stream.available = fake, fake_set, lambda: True
files = json.loads(sys.argv[1])
g = torch.Generator().manual_seed(0)
res = {}
for form, path in files.items():
    with open(path) as f:
        doc = json.load(f)
    ins = {}
    for n in doc["nodes"]:
        if n["kind"] != "input":
            continue
        r = n["results"][0]
        name, dt = r["name"], r["type"]["dtype"]
        shape = [{"batch": 3, "seq": 2, "past": 4, "groups": 2, "past + seq": 6}.get(d, d) for d in r["type"]["shape"]]
        if name.startswith("slots."):
            t = (torch.rand(shape, generator=g) * 2 - 1) * 0.3
            t[0] = 0
            ins[name] = t.to(torch.bfloat16)
        elif dt == "bf16":
            ins[name] = ((torch.rand(shape, generator=g) * 2 - 1) * (shape[-1] ** -0.5 if len(shape) == 2 else 1)).to(torch.bfloat16)
        elif name in ("input_ids", "position_ids"):
            ins[name] = torch.randint(0, 40, shape, generator=g)
        elif name == "attention_mask":
            ins[name] = torch.zeros(shape)
        elif name == "row_slot":
            ins[name] = torch.tensor([2, 0, 1])
        elif name == "one_slot":
            ins[name] = torch.tensor(2)
        elif name == "row_mask":
            ins[name] = torch.tensor([1.0, 0.0, 1.0]).reshape(3, 1, 1)
        elif name == "group_slot":
            ins[name] = torch.tensor([2, 1])
        elif name == "row_group":
            ins[name] = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    outs = []
    for mode in ("1", "0"):
        os.environ["STAGEML_TORCH_FUSE"] = mode
        prog = Program(doc, {})
        with torch.no_grad():
            outs.append(prog.run(ins)["logits"].float())
        if mode == "1":
            slot_sets = prog.slot_sets
    a, b = outs
    res[form] = {"calls": len(calls), "slots": calls[0], "rel": float((a - b).norm() / b.norm()), "slot_sets": slot_sets, "sets": sorted(sets)}
    calls.clear()
    sets.clear()
print(json.dumps(res))
`;
    const r = spawnSync(python, ['-c', code, JSON.stringify(files)], { env: { ...process.env, PYTHONPATH: fileURLToPath(new URL('../../../native', import.meta.url)) }, encoding: 'utf8' });
    expect(r.stderr).toBe('');
    const res = JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, { calls: number; slots: number[]; rel: number; slot_sets: number; sets: number[] }>;
    const want = { gathered: [2, 2, -1, -1, 1, 1], single: [2, 2, -1, -1, 2, 2], grouped: [2, 2, -1, -1, 1, 1] };
    for (const [form, slots] of Object.entries(want)) {
      // q, k and v as one set and gate and up as another (one input each); o and down alone.
      expect(res[form]!.slot_sets, form).toBe(LAYERS * 2);
      expect(res[form]!.sets, form).toEqual([...Array<number>(LAYERS).fill(2), ...Array<number>(LAYERS).fill(3)]);
      expect(res[form]!.calls, form).toBe(LAYERS * 2);
      expect(res[form]!.slots, form).toEqual(slots);
      expect(res[form]!.rel, form).toBeLessThan(3e-2);
    }
  }, 120_000);

  it("builds every bank kernel a program can reach before its first run: each input's set (q, k, v; gate, up) and each projection alone, at every row bucket, with the real shapes", () => {
    const dir = mkdtempSync(join(tmpdir(), 'torch-bank-warm-'));
    const file = join(dir, 'gathered.json');
    writeFileSync(file, JSON.stringify(graphToJson(program('gathered'))));
    const code = `
import json, os, sys
import torch
os.environ["STAGEML_TORCH_FUSE"] = "1"
from stageml_torch import bank, stream
from stageml_torch.graph import Program
runs = []
def fake(x, w, a_bank, b_bank, slots, ranks, scales, cfg=None, out=None, b_bank_t=None):
    runs.append(["one", x.shape[0], tuple(w.shape), tuple(a_bank.shape), tuple(b_bank_t.shape), int(ranks[0]), int(slots.numel())])
    return torch.zeros(x.shape[0], x.shape[1], w.shape[0], dtype=x.dtype)
def fake_set(x, items, slots):
    runs.append(["set", x.shape[0], [tuple(w.shape) for w, a, b, r, s, bt in items], [tuple(a.shape) for w, a, b, r, s, bt in items]])
    return None if len(items) == 2 else [torch.zeros(1) for _ in items]
stream.lora_bank_linear, stream.lora_bank_linear_set, stream.available = fake, fake_set, lambda: True
with open(sys.argv[1]) as f:
    prog = Program(json.load(f), {})
sets = bank.kernel_sets(prog.steps, prog.value_types)
calls = stream.warm_bank("cpu", sets)
print(json.dumps({"sets": sets, "calls": calls, "runs": runs, "onCpu": bank.warm(prog.steps, prog.value_types, "cpu")}))
`;
    const python = [process.env['STAGEML_PYTHON'], 'python3', '/usr/bin/python3'].find((c) => c !== undefined && c !== '' && spawnSync(c, ['-c', 'import torch']).status === 0)!;
    const r = spawnSync(python, ['-c', code, file], { env: { ...process.env, PYTHONPATH: fileURLToPath(new URL('../../../native', import.meta.url)) }, encoding: 'utf8' });
    expect(r.stderr).toBe('');
    type Run = ['one', number, number[], number[], number[], number, number] | ['set', number, number[][], number[][]];
    const res = JSON.parse(r.stdout.trim().split('\n').pop()!) as { sets: [number, [number, number][]][]; calls: number; runs: Run[]; onCpu: number };
    const h = cfg.hiddenSize;
    const kv = cfg.numKvHeads * cfg.headDim;
    const ffn = cfg.intermediateSize;
    // Per layer: q/k/v of x, o, gate/up, down — the widest rank (R) of the slot tables each.
    const perLayer: [number, [number, number][]][] = [
      [h, [[h, RANK], [kv, RANK], [kv, RANK]]],
      [h, [[h, RANK]]],
      [h, [[ffn, RANK], [ffn, RANK]]],
      [ffn, [[h, RANK]]],
    ];
    expect(res.sets).toHaveLength(4);
    expect(new Set(res.sets.map((s) => JSON.stringify(s)))).toEqual(new Set(perLayer.map((s) => JSON.stringify(s))));
    // Distinct shapes once each, at 8, 16, 32 and 64 rows.
    expect(res.calls).toBe(4 * 4);
    const rowsOf = (kind: string) => res.runs.filter((x) => x[0] === kind).map((x) => x[1]);
    // Sets of 3 ran as a set (the stand-in took them); sets of 2 were declined and ran member by member.
    expect(rowsOf('set').sort((a, b) => a - b)).toEqual([8, 8, 16, 16, 32, 32, 64, 64]);
    const ones = res.runs.filter((x): x is Extract<Run, ['one', ...unknown[]]> => x[0] === 'one');
    expect(ones).toHaveLength(4 * (2 + 2));
    for (const o of ones) {
      const [, m, w, a, bt, rank, slots] = o;
      expect([8, 16, 32, 64]).toContain(m);
      expect(a).toEqual([1, RANK, w[1]]);
      expect(bt).toEqual([1, RANK, w[0]]);
      expect(rank).toBe(RANK);
      expect(slots).toBe(m);
    }
    // On the CPU the worker builds nothing at prepare.
    expect(res.onCpu).toBe(0);
  }, 120_000);

  it('keeps built kernel images on disk, keyed by everything they depend on, and rebuilds a malformed entry', () => {
    const dir = mkdtempSync(join(tmpdir(), 'torch-kcache-'));
    const code = `
import json, os, sys
from stageml_torch import tma
d = sys.argv[1]
built = []
def build():
    built.append(1)
    return b"\\x7fELF image", {"lora_add": "_Z8lora_addPtPKfPKiii"}
k = tma.cache_key("src", ["lora_add"], ("-std=c++17",), (12, 9))
first = tma.cached_image(k, build, d)
second = tma.cached_image(k, build, d)
other = tma.cache_key("src2", ["lora_add"], ("-std=c++17",), (12, 9)) != k and tma.cache_key("src", ["lora_add"], ("-std=c++17",), (13, 0)) != k
with open(os.path.join(d, k + ".bin"), "wb") as f:
    f.write(b"not an entry")
third = tma.cached_image(k, build, d)
fourth = tma.cached_image(k, build, d)
ro = tma.cached_image(k, build, "/proc/stageml-no-such-dir")
print(json.dumps({"built": len(built), "hits": tma.BUILDS["cached"], "same": first == second == third == fourth == ro, "keysDiffer": other, "image": first[0].decode("latin1")}))
`;
    const python = [process.env['STAGEML_PYTHON'], 'python3', '/usr/bin/python3'].find((c) => c !== undefined && c !== '' && spawnSync(c, ['-c', 'import torch']).status === 0)!;
    const r = spawnSync(python, ['-c', code, dir], { env: { ...process.env, PYTHONPATH: fileURLToPath(new URL('../../../native', import.meta.url)) }, encoding: 'utf8' });
    expect(r.stderr).toBe('');
    const res = JSON.parse(r.stdout.trim().split('\n').pop()!) as { built: number; hits: number; same: boolean; keysDiffer: boolean; image: string };
    // Built once; read back; the malformed entry rebuilt once and read back; an unwritable cache builds.
    expect(res).toEqual({ built: 3, hits: 2, same: true, keysDiffer: true, image: '\x7fELF image' });
  }, 60_000);

  it('leaves the PEFT-exact programs (adapterDtype f32: casts in each chain) unfused', async () => {
    const p = await fused.prepare(program('gathered', 'f32'));
    expect(p.fused).toMatchObject({ slotLinears: 0, slotSets: 0 });
    p.dispose();
  }, 120_000);
});
