// `stageml stage --dtype bf16` (default `--adapter-dtype f32`) run by the torch executor's worker on
// CPU torch: every LoRA linear, RMSNorm and rotary of the fixture's prefill equals, bit for bit, a
// pure-torch reimplementation of what PEFT and transformers compute in bf16 (PEFT's LoRA forward
// with its adapter factors autocast to f32; LlamaRMSNorm; apply_rotary_pos_emb).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createTorchExecutor, isTorchAvailable } from '@stageml/runtime';
import { beforeAll, describe, expect, it } from 'vitest';
import { ExitCode } from './index.js';
import { fixture, runCaptured as run } from './test-fixtures.js';

const NATIVE = fileURLToPath(new URL('../../../native', import.meta.url));

// Runs the bundle's prefill in the worker's Program (CPU), keeping the values each check reads, and
// recomputes them from their kept inputs with the library formulas. Prints one JSON line.
const CHECK = String.raw`
import json, sys
import torch
import torch.nn.functional as F
from stageml_torch.bundle import load_bundle
from stageml_torch.safetensors_io import read_safetensors

bundle, ids, scale, eps, ref_dir = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
prog = load_bundle(bundle, "cpu")
doc = prog.doc
consts = read_safetensors(bundle + "/constants.safetensors")
# The adapter's own f32 factors (PEFT's values), read from the adapter checkpoint.
factors = read_safetensors(ref_dir + "/adapter_model.safetensors")
vals, node_of = [], []
for i, n in enumerate(doc["nodes"]):
    for r in n["results"]:
        vals.append(r["name"]); node_of.append(i)
uses = {}
for i, n in enumerate(doc["nodes"]):
    for o in n["operands"]:
        uses.setdefault(o, []).append(i)
first = {}
for v, i in enumerate(node_of):
    first.setdefault(i, v)
nodes = doc["nodes"]
lora, norms, rot = [], [], []
for i, n in enumerate(nodes):
    if n["kind"] != "op":
        continue
    names = [vals[o] for o in n["operands"]]
    if n["op"] == "sml.linear" and names[1].endswith(".weight") and any(k.endswith(names[1][: -len(".weight")] + ".lora_A") for k in consts):
        v = first[i]
        while len(uses.get(v, [])) == 1 and nodes[uses[v][0]]["op"] in ("sml.cast", "sml.add"):
            nxt = first[uses[v][0]]
            if nodes[uses[v][0]]["op"] == "sml.add" and not any(nodes[node_of[o]]["op"] == "sml.mul" for o in nodes[uses[v][0]]["operands"] if o != v):
                break
            v = nxt
        lora.append((names[1][: -len(".weight")], names[0], vals[v]))
    if n["op"] == "sml.lora_linear":
        # A chain stageml stage folded into the op (same dtype throughout: --adapter-dtype same).
        lora.append((names[1][: -len(".weight")], names[0], vals[first[i]]))
    if n["op"] == "sml.mul" and names[1].endswith("norm.weight"):
        norms.append((names[1], vals[nodes[node_of[n["operands"][0]]]["operands"][0]], vals[first[i]]))
    if n["op"] == "sml.add" and vals[first[i]].split(".")[-1].startswith("rotary"):
        cosn = nodes[node_of[n["operands"][0]]]
        rot.append((vals[cosn["operands"][0]], vals[cosn["operands"][1]], vals[first[i]]))
t = len(ids)
inp = {"input_ids": torch.tensor([ids]), "position_ids": torch.arange(t).reshape(1, t), "attention_mask": torch.zeros(1, t)}
for name, vid in prog.inputs:
    if name.startswith("past_"):
        _, _, shape = prog.value_types[vid]
        inp[name] = torch.zeros((1, shape[1], 0, shape[3]))
keep = sorted({v for row in lora + norms for v in row[1:]} | {v for row in rot for v in row} | {"rope.sin.bf16"})
out = prog.run(inp, keep=keep)
res = {"lora": 0, "lora_equal": 0, "lora_equal_peft_f32_factors": 0, "norms": 0, "norms_equal": 0, "rotary": 0, "rotary_equal": 0, "lora_factor_dtypes": []}
for mod, x_name, y_name in lora:
    x, y = out[x_name], out[y_name]
    W = consts[mod + ".weight"]
    A = consts[[k for k in consts if k.endswith(mod + ".lora_A")][0]]
    B = consts[[k for k in consts if k.endswith(mod + ".lora_B")][0]]
    res["lora_factor_dtypes"] = sorted(set(res["lora_factor_dtypes"]) | {str(A.dtype), str(B.dtype)})
    # PEFT 0.21 lora.Linear.forward: result = base_layer(x); x = x.to(lora_A.weight.dtype);
    # result = result + lora_B(lora_A(dropout(x))) * scaling; result = result.to(torch_result_dtype)
    result = F.linear(x, W)
    ref = (result + F.linear(F.linear(x.to(A.dtype), A), B) * scale).to(result.dtype)
    res["lora"] += 1
    res["lora_equal"] += int(torch.equal(ref, y))
    # The same formula with the adapter checkpoint's own f32 factors (what PEFT holds).
    key = "base_model.model." + mod
    Af, Bf = factors[key + ".lora_A.weight"], factors[key + ".lora_B.weight"]
    ref32 = (result + F.linear(F.linear(x.to(Af.dtype), Af), Bf) * scale).to(result.dtype)
    res["lora_equal_peft_f32_factors"] += int(torch.equal(ref32, y))
for w_name, x_name, y_name in norms:
    # transformers LlamaRMSNorm.forward
    h = out[x_name].to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    ref = consts[w_name] * h.to(out[x_name].dtype)
    res["norms"] += 1
    res["norms_equal"] += int(torch.equal(ref, out[y_name]))
for x_name, cos_name, y_name in rot:
    # transformers apply_rotary_pos_emb with rotate_half
    q, cos, sin = out[x_name], out[cos_name], out["rope.sin.bf16"]
    half = q.shape[-1] // 2
    ref = (q * cos) + (torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin)
    res["rotary"] += 1
    res["rotary_equal"] += int(torch.equal(ref, out[y_name]))
print(json.dumps(res))
`;

const available = isTorchAvailable();

describe.skipIf(!available && process.env['CI'] === undefined)('PEFT-exact bf16 residual on the torch worker (CPU)', () => {
  let dir: string;
  let python: string;
  let ids: number[];
  beforeAll(async () => {
    if (!available) throw new Error('the torch executor tests need Python 3 with torch in CI: apt-get install python3-torch (or set STAGEML_PYTHON)');
    const ex = await createTorchExecutor({ device: 'cpu' });
    python = ex.info.python;
    await ex.close();
    dir = mkdtempSync(join(tmpdir(), 'stageml-peft-exact-'));
    const golden = JSON.parse(readFileSync(fixture('peft-tiny/golden.json'), 'utf8')) as { 'llama.all-r16': Record<string, { input_ids: number[] }> };
    ids = golden['llama.all-r16']['prompt0']!.input_ids;
  }, 120_000);

  const check = (bundle: string): Record<string, number | string[]> => {
    // all-r16: lora_alpha 8, r 16 (scaling 0.5); the fixture's rms_norm_eps 1e-6.
    const r = spawnSync(python, ['-c', CHECK, bundle, JSON.stringify(ids), '0.5', '1e-6', fixture('peft-tiny/llama/adapters/all-r16')], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: NATIVE }, timeout: 120_000 });
    expect(r.stderr).toBe('');
    expect(r.status).toBe(0);
    return JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, number | string[]>;
  };

  it('--adapter-dtype f32 (default): every LoRA linear, norm and rotary equals PEFT/transformers in bf16 bit for bit', async () => {
    const bundle = join(dir, 'f32');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/all-r16'), '--cutoff', 'adapter', '--dtype', 'bf16', '--out', bundle]);
    expect(staged.code).toBe(ExitCode.OK);
    const r = check(bundle);
    expect(r['lora_factor_dtypes']).toEqual(['torch.float32']);
    expect(r['lora']).toBe(14);
    expect(r['lora_equal']).toBe(14);
    expect(r['lora_equal_peft_f32_factors']).toBe(14);
    expect(r['norms']).toBe(5); // two per layer and the final norm
    expect(r['norms_equal']).toBe(5);
    expect(r['rotary']).toBe(4); // q and k per layer
    expect(r['rotary_equal']).toBe(4);
  }, 120_000);

  it('--adapter-dtype same: bf16 factors, so PEFT with its f32 factors is not matched', async () => {
    const bundle = join(dir, 'same');
    const staged = await run(['stage', '--model', fixture('peft-tiny/llama/base'), '--adapter', fixture('peft-tiny/llama/adapters/all-r16'), '--cutoff', 'adapter', '--dtype', 'bf16', '--adapter-dtype', 'same', '--out', bundle]);
    expect(staged.code).toBe(ExitCode.OK);
    const r = check(bundle);
    expect(r['lora_factor_dtypes']).toEqual(['torch.bfloat16']);
    expect(r['lora']).toBe(14);
    expect(r['lora_equal_peft_f32_factors']).toBeLessThan(14);
    expect(r['norms_equal']).toBe(5);
    expect(r['rotary_equal']).toBe(4);
  }, 120_000);

  it('the worker runs a bundle\'s LoRA chains as their ops, even when asked for kernel steps (STAGEML_TORCH_FUSE=1): it recognises no primitive pattern', () => {
    // A loraLinear step (the folded chain of a --adapter-dtype same bundle) counts as its three linears.
    const script = 'import sys\nfrom stageml_torch.bundle import load_bundle\nfor d in sys.argv[1:]:\n    p = load_bundle(d, "cpu")\n    print(p.fused_slots, sum({"linear": 1, "loraLinear": 3}.get(st[0], 0) for st in p.steps))';
    const r = spawnSync(python, ['-c', script, join(dir, 'f32'), join(dir, 'same')], { encoding: 'utf8', env: { ...process.env, PYTHONPATH: NATIVE, STAGEML_TORCH_FUSE: '1' }, timeout: 120_000 });
    expect(r.stderr).toBe('');
    const lines = r.stdout.trim().split('\n').map((l) => l.split(' ').map(Number));
    // No kernel step; each of the 14 LoRA linears keeps its base, shrink and expand linears.
    for (const [slots, linears] of lines) {
      expect(slots).toBe(0);
      expect(linears).toBeGreaterThanOrEqual(14 * 3);
    }
  }, 120_000);
});
