"""Decode step of a Llama-3-8B-shaped model (random bf16 weights drawn here, never transferred) with
64 LoRA adapters on all seven projections: 64 streams on 64 different adapters against the
base-only step, and against PEFT's mixed batch (`adapter_names`) in the same run.

Ours: one decode step as torch ops (cuBLAS base GEMMs, SDPA over a static KV cache, norms and
rotary as Hugging Face computes them) plus, per projection, the SGMV shrink/expand kernels that
`stageml gen triton` generated for the 64-adapter bank (bench/gpu/prepare-e2e.ts), captured in one
CUDA graph and replayed. The weights are the PEFT model's own tensors (no copy).

    python3 bench/gpu/decode8b.py --root DIR --out decode8b.json
    python3 bench/gpu/decode8b.py --kernel stream --out decode8b-stream.json

`--kernel stream`: the 64-adapter step runs every projection through `stream.lora_bank_linear`
(native/stageml_torch/stream.py: base GEMM + the row's adapter, slot per row; whichever kernel its
table names for the row count: the fused streaming kernels at ≤ 16 rows, cuBLAS + lora_shrink +
lora_expand at 17-64) on random bank factors (no PEFT model, no generated launchers needed); base =
the same step with cuBLAS and no adapters. Checked against the same step with torch ops (gathered
factors, f32).
"""
import argparse
import importlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4096, 14336, 32, 8, 128, 128256
PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SHAPE_OF = {"q_proj": "qo", "o_proj": "qo", "k_proj": "kv", "v_proj": "kv", "gate_proj": "gu", "up_proj": "gu", "down_proj": "dn"}
CONTEXT = 256  # positions attended by the timed step (KV cache filled with random values)
LMAX = 320


def load_launchers(root, mix):
    """The generated SGMV launcher per projection shape (modules of different dirs share names)."""
    out = {}
    for shape in ("qo", "kv", "gu", "dn"):
        d = os.path.join(root, "triton", "%s-%s" % (shape, mix))
        sys.path.insert(0, d)
        for m in ("lora_bank_y", "lora_bank_y_launch", "stageml_triton_common"):
            sys.modules.pop(m, None)
        out[shape] = importlib.import_module("lora_bank_y_launch")
        sys.path.pop(0)
    return out


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


class Ours:
    """A decode step over the HF model's weights; banks per (layer, projection) when adapters are on."""

    def __init__(self, model, rope_theta):
        inner = model.base_model.model if hasattr(model, "peft_config") else model
        self.embed = inner.model.embed_tokens.weight
        self.norm_w = inner.model.norm.weight
        self.lm_head = inner.lm_head.weight
        self.eps = inner.config.rms_norm_eps
        self.layers = []
        for layer in inner.model.layers:
            mods = {p: getattr(layer.self_attn if p in PROJ[:4] else layer.mlp, p) for p in PROJ}
            self.layers.append({"in_norm": layer.input_layernorm.weight, "post_norm": layer.post_attention_layernorm.weight,
                                "w": {p: (m.base_layer.weight if hasattr(m, "base_layer") else m.weight) for p, m in mods.items()}, "mods": mods})
        self.inv_freq = 1.0 / (rope_theta ** (torch.arange(0, HEAD_DIM, 2, device="cuda", dtype=torch.float32) / HEAD_DIM))
        self.banks = None

    def pack(self, launchers, names, mix_name):
        self.launchers = launchers
        self.banks = []
        for lay in self.layers:
            row = {}
            for p, m in lay["mods"].items():
                a = [m.lora_A[n].weight for n in names]
                b = [m.lora_B[n].weight for n in names]
                s = [m.scaling[n] for n in names]
                row[p] = launchers[SHAPE_OF[p]].pack(a, b, s)
            self.banks.append(row)
        self.mix = mix_name

    def pack_random(self, launchers, ranks, mix_name):
        """Banks of random factors (no PEFT model: timing only), B scaled as add_adapters does."""
        self.launchers = launchers
        self.banks = []
        for lay in self.layers:
            row = {}
            for p, w in lay["w"].items():
                n, k = w.shape
                a = [torch.randn((r, k), device="cuda", dtype=torch.bfloat16) / math.sqrt(k) for r in ranks]
                b = [torch.randn((n, r), device="cuda", dtype=torch.bfloat16) * (0.05 / math.sqrt(r)) for r in ranks]
                row[p] = launchers[SHAPE_OF[p]].pack(a, b, [2.0] * len(ranks))
            self.banks.append(row)
        self.mix = mix_name

    def rms(self, x, w):
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def lin(self, x, l, p, meta):
        y = F.linear(x, self.layers[l]["w"][p])
        if meta is not None:
            ln = self.launchers[SHAPE_OF[p]]
            bank = self.banks[l][p]
            ln.expand(y, ln.shrink(x, bank, meta), bank, meta)
        return y

    def lins(self, x, l, ps, meta):
        """The projections ps of one input x (q, k, v; gate, up)."""
        return [self.lin(x, l, p, meta) for p in ps]

    def step(self, ids, pos, kc, vc, meta):
        """Next-token logits [B, V] for tokens ids [B] at position pos [1]; writes the KV caches."""
        b = ids.shape[0]
        h = self.embed.index_select(0, ids)
        ang = pos.float().reshape(1, 1) * self.inv_freq.reshape(1, -1)
        emb = torch.cat((ang, ang), -1)
        cos = emb.cos().to(h.dtype).reshape(1, 1, 1, HEAD_DIM)
        sin = emb.sin().to(h.dtype).reshape(1, 1, 1, HEAD_DIM)
        mask = (torch.arange(LMAX, device=ids.device) <= pos).reshape(1, 1, 1, LMAX)

        def rot(t):
            half = HEAD_DIM // 2
            return t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin

        for l, lay in enumerate(self.layers):
            x = self.rms(h, lay["in_norm"])
            q, k, v = self.lins(x, l, ("q_proj", "k_proj", "v_proj"), meta)
            q = q.reshape(b, HEADS, 1, HEAD_DIM)
            k = k.reshape(b, KV_HEADS, 1, HEAD_DIM)
            v = v.reshape(b, KV_HEADS, 1, HEAD_DIM)
            q, k = rot(q), rot(k)
            kc[l].index_copy_(2, pos, k)
            vc[l].index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc[l], vc[l], attn_mask=mask, enable_gqa=True)
            h = h + self.lin(a.reshape(b, HIDDEN), l, "o_proj", meta)
            x = self.rms(h, lay["post_norm"])
            g, u = self.lins(x, l, ("gate_proj", "up_proj"), meta)
            m = F.silu(g) * u
            h = h + self.lin(m, l, "down_proj", meta)
        return F.linear(self.rms(h, self.norm_w), self.lm_head)


class StreamBanks:
    """Per (layer, projection) banks for the fused kernel: A [64, R, K], B [64, N, R] (zero beyond
    each adapter's rank), ranks, scales; `lin` replaces Ours.lin."""

    def __init__(self, ours, ranks, with_transposed=False):
        from stageml_torch import stream as st  # noqa: PLC0415

        self.st = st
        rmax = max(ranks)
        self.ranks = torch.tensor(ranks, device="cuda", dtype=torch.int32)
        self.scales = torch.full((len(ranks),), 2.0, device="cuda", dtype=torch.float32)
        self.banks = []
        for lay in ours.layers:
            row = {}
            for p, w in lay["w"].items():
                n, k = w.shape
                a = torch.randn((len(ranks), rmax, k), device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
                b = torch.randn((len(ranks), n, rmax), device="cuda", dtype=torch.bfloat16) * (0.05 / math.sqrt(16))
                for j, r in enumerate(ranks):
                    a[j, r:] = 0
                    b[j, :, r:] = 0
                # the same factors stored [64, R, N] too (lora_bank_linear's b_bank_t; lora_expand4 reads them)
                row[p] = (a, b, b.transpose(1, 2).contiguous() if with_transposed else None)
            self.banks.append(row)
        self.fallbacks = 0
        self.transposed = False
        self.set_misses = 0

    def lins(self, ours, x, l, ps, slots):
        """ps through `stream.lora_bank_linear_set` (one shrink and one expand for them all beside
        their base GEMMs); each through `lin` where the set path declines."""
        items = [(ours.layers[l]["w"][p], *self.banks[l][p][:2], self.ranks, self.scales, self.banks[l][p][2]) for p in ps]
        ys = self.st.lora_bank_linear_set(x, items, slots)
        if ys is not None:
            return ys
        self.set_misses += 1
        return [self.lin(ours, x, l, p, slots) for p in ps]

    def lin(self, ours, x, l, p, slots, reference=False):
        w = ours.layers[l]["w"][p]
        a, b, bt = self.banks[l][p]
        if not reference:
            # b_bank_t: the factors also stored [S, R, N], which the 17-64-row path reads (lora_expand4)
            y = self.st.lora_bank_linear(x, w, a, b, slots, self.ranks, self.scales, b_bank_t=bt if self.transposed else None)
            if y is not None:
                return y
            self.fallbacks += 1
        # torch ops: the rows' factors gathered (padding is zero), f32 accumulation.
        ag = a.index_select(0, slots.long()).float()
        bg = b.index_select(0, slots.long()).float()
        t = torch.bmm(ag, x.float().unsqueeze(-1))
        d = torch.bmm(bg, t).squeeze(-1) * self.scales.index_select(0, slots.long()).unsqueeze(-1)
        return (F.linear(x, w).float() + d).to(x.dtype)


def stream_main(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    from stageml_torch import stream as st_tables  # noqa: PLC0415 - the tables this run dispatches with (overrides applied)

    dev = "cuda"
    mixes = {"mixed": [[8, 16, 64][i % 3] for i in range(64)], "r8": [8] * 64, "r16": [16] * 64}
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                    "context": CONTEXT, "kernel": "stream.lora_bank_linear (the dispatch table's kernel per row count)", "blas": str(torch.backends.cuda.preferred_blas_library()), "bank_table": {str(k): list(v) if v else None for k, v in st_tables.DEFAULT_BANK.items()},
                    "model": "Llama-3-8B shape: 32 layers, hidden 4096, intermediate 14336, GQA 32/8, head 128, vocab 128256, random bf16"},
           "steps": [], "checks": {}}
    t0 = time.time()
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, vocab_size=VOCAB, rope_theta=500000.0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=False)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev), torch.no_grad():
        base = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    ours = Ours(base, 500000.0)
    base_bytes = 2 * (LAYERS * (HIDDEN * HIDDEN * 2 + HIDDEN * 1024 * 2 + 3 * HIDDEN * INTER) + VOCAB * HIDDEN)
    per_rank_bytes = 2 * LAYERS * (2 * (HIDDEN + HIDDEN) + 2 * (HIDDEN + 1024) + 3 * (HIDDEN + INTER))
    res["meta"]["base_weight_bytes"] = base_bytes
    print("model built in %.1f s" % (time.time() - t0), flush=True)
    # --bank-tables: more dispatch tables ({"bank": {bucket: cfg}} files, as STAGEML_STREAM_CONFIGS)
    # whose 64-adapter step is timed (and checked at 64 streams) beside the built-in one's
    tables = [("default", dict(st_tables.DEFAULT_BANK, b_transposed=not args.no_b_transposed))]
    if args.set:
        # the built-in table, q/k/v and gate/up each through one lora_bank_linear_set
        tables.append(("set", dict(st_tables.DEFAULT_BANK, b_transposed=True, set=True)))
    for path in [v for v in (args.bank_tables or "").split(",") if v]:
        with open(path) as fh:
            over = {int(k): tuple(v) if v is not None else None for k, v in json.load(fh).get("bank", {}).items()}
        t = dict(st_tables.DEFAULT_BANK)
        t.update(over)
        with open(path) as fh:
            doc = json.load(fh)
            t["b_transposed"] = bool(doc.get("b_transposed", False))
            t["set"] = bool(doc.get("set", False))  # q/k/v and gate/up through lora_bank_linear_set
        tables.append((os.path.splitext(os.path.basename(path))[0], t))
    res["meta"]["bank_tables"] = {n: {str(k): (list(v) if isinstance(v, tuple) else v) for k, v in t.items()} for n, t in tables}
    kc = [torch.randn((64, KV_HEADS, LMAX, HEAD_DIM), device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    vc = [torch.randn((64, KV_HEADS, LMAX, HEAD_DIM), device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    with torch.no_grad():
        for mix in ("mixed", "r8", "r16"):
            banks = StreamBanks(ours, mixes[mix], with_transposed=any(t.get("b_transposed") for _, t in tables))
            for b in [int(x) for x in args.batches.split(",")] if mix == "mixed" else [64]:
                slots = torch.arange(b, device=dev, dtype=torch.int32) % 64
                ids = torch.randint(0, VOCAB, (b,), device=dev)
                pos = torch.full((1,), CONTEXT - 1, dtype=torch.int64, device=dev)
                kb = [t[:b] for t in kc]
                vb = [t[:b] for t in vc]
                row = {"mix": mix, "batch": b, "adapters": min(b, 64)}
                for ti, (tname, table) in enumerate(tables):
                    st_tables.DEFAULT_BANK.clear()
                    st_tables.DEFAULT_BANK.update({kk: vv for kk, vv in table.items() if kk not in ("b_transposed", "set")})
                    banks.transposed = table.get("b_transposed", False)
                    key = "" if ti == 0 else "table_%s_" % tname
                    if b == 64:
                        ours.lin = lambda x, l, p, meta: banks.lin(ours, x, l, p, slots, reference=True)
                        ref = ours.step(ids, pos, [t.clone() for t in kb], [t.clone() for t in vb], slots).float()
                        ours.lin = lambda x, l, p, meta: banks.lin(ours, x, l, p, slots)
                        if table.get("set"):
                            ours.lins = lambda x, l, ps, meta: banks.lins(ours, x, l, ps, slots)
                        mine = ours.step(ids, pos, [t.clone() for t in kb], [t.clone() for t in vb], slots).float()
                        del ours.lin
                        ours.__dict__.pop("lins", None)
                        base_l = ours.step(ids, pos, [t.clone() for t in kb], [t.clone() for t in vb], None).float()
                        res["checks"][mix + ("" if ti == 0 else " " + tname)] = {
                            "stream_vs_torch_rel": float((mine - ref).norm() / ref.norm()), "argmax_agree": float((mine.argmax(-1) == ref.argmax(-1)).float().mean()),
                            "adapter_effect_rel": float((ref - base_l).norm() / base_l.norm()), "fallbacks": banks.fallbacks, "set_misses": banks.set_misses}
                        print("check %s %s: %s" % (mix, tname, res["checks"][mix + ("" if ti == 0 else " " + tname)]), flush=True)
                    for mode in ("base", "lora") if ti == 0 else ("lora",):
                        if mode == "lora":
                            ours.lin = lambda x, l, p, meta: banks.lin(ours, x, l, p, slots)
                            if table.get("set"):
                                ours.lins = lambda x, l, ps, meta: banks.lins(ours, x, l, ps, slots)
                        g, _ = graphed(lambda: ours.step(ids, pos, kb, vb, slots if mode == "lora" else None))
                        ms = median_ms(g.replay, args.reps)
                        if mode == "lora":
                            del ours.lin
                            ours.__dict__.pop("lins", None)
                        row[key + mode + "_ms"] = ms
                        row[key + mode + "_tok_s"] = b * 1000.0 / ms
                        del g
                    if ti > 0:
                        row[key + "lora_over_base"] = row[key + "lora_ms"] / row["base_ms"]
                        print("  table %s: %.2f ms (x%.3f)" % (tname, row[key + "lora_ms"], row[key + "lora_over_base"]), flush=True)
                st_tables.DEFAULT_BANK.clear()
                st_tables.DEFAULT_BANK.update({kk: vv for kk, vv in tables[0][1].items() if kk not in ("b_transposed", "set")})
                row["lora_over_base"] = row["lora_ms"] / row["base_ms"]
                row["byte_floor_ratio"] = 1 + sum(mixes[mix][i % 64] for i in range(b)) * per_rank_bytes / base_bytes
                row["fallbacks"] = banks.fallbacks
                res["steps"].append(row)
                print("step %s b=%d: base %.2f ms, 64-adapter %.2f ms (x%.2f; byte floor x%.2f)" % (mix, b, row["base_ms"], row["lora_ms"], row["lora_over_base"], row["byte_floor_ratio"]), flush=True)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)
            del banks
            torch.cuda.empty_cache()


def make_meta(launchers, b, num_adapters, device):
    """Row blocks of a batch whose row i runs adapter i (mod the bank size); built once per batch."""
    group = torch.arange(b, device=device, dtype=torch.int32) % num_adapters
    return launchers["qo"].common.make_row_meta(group, num_adapters)


def graphed(fn, warm=3):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", default=None, help="the prepared folder (generated launchers, mixes.json); not needed with --kernel stream")
    ap.add_argument("--kernel", default="generated", choices=["generated", "stream"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--peft-batches", default="1,8,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-b-transposed", action="store_true", help="--kernel stream: the built-in table's step without b_bank_t (B stored [S, N, R] only)")
    ap.add_argument("--bank-tables", default=None, help="--kernel stream: comma-separated JSON files of more bank tables to time beside the built-in one")
    ap.add_argument("--set", action="store_true", help="--kernel stream: also time the 64-adapter step with q/k/v and gate/up each through one stream.lora_bank_linear_set")
    ap.add_argument("--blas", default=None, choices=["cublas", "cublaslt"], help="torch.backends.cuda.preferred_blas_library for every GEMM of both steps (default: torch's)")
    args = ap.parse_args()
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    if args.kernel == "stream":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "native"))
        return stream_main(args)
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM
    import transformers, peft  # noqa: E401

    dev = "cuda"
    mixes = json.load(open(os.path.join(args.root, "mixes.json")))
    res = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__, "transformers": transformers.__version__,
                    "peft": peft.__version__, "device": torch.cuda.get_device_name(), "context": CONTEXT,
                    "model": "Llama-3-8B shape: 32 layers, hidden 4096, intermediate 14336, GQA 32/8, head 128, vocab 128256, random bf16"},
           "steps": [], "checks": {}, "peft": []}
    t0 = time.time()
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                      head_dim=HEAD_DIM, vocab_size=VOCAB, rope_theta=500000.0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=False)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        base = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    base.eval()
    print("model built in %.1f s" % (time.time() - t0), flush=True)

    def add_adapters(model, mix):
        ranks = mixes[mix]
        names = ["%s%d" % (mix, i) for i in range(len(ranks))]
        # Built on the GPU in bf16 (PEFT would otherwise create and initialise each factor on the CPU).
        torch.set_default_dtype(torch.bfloat16)
        with torch.device(dev):
            for i, (n, r) in enumerate(zip(names, ranks)):
                lc = LoraConfig(r=r, lora_alpha=2 * r, target_modules=PROJ, init_lora_weights=False, lora_dropout=0.0)
                if not isinstance(model, peft.PeftModel):
                    model = get_peft_model(model, lc, adapter_name=n, autocast_adapter_dtype=False)
                else:
                    model.add_adapter(n, lc)
                if i % 16 == 15:
                    print("  %d adapters after %.1f s" % (i + 1, time.time() - t0), flush=True)
        torch.set_default_dtype(torch.float32)
        with torch.no_grad():
            for pn, p in model.named_parameters():
                if "lora_" in pn and p.dtype != torch.bfloat16:
                    p.data = p.data.to(torch.bfloat16)
                if "lora_B" in pn:
                    # PEFT's random init leaves B's scale like A's; shrink it so deltas stay ~1% of the base output.
                    p.data.mul_(0.05)
        return model, names

    t0 = time.time()
    model, names_mixed = add_adapters(base, "mixed")
    model.eval()
    print("64 adapters added in %.1f s; GPU memory %.1f GB" % (time.time() - t0, torch.cuda.memory_allocated() / 1e9), flush=True)
    ours = Ours(model, 500000.0)

    ranks_of = {"mixed": mixes["mixed"], "r8": mixes["r8"]}
    base_bytes = 2 * (LAYERS * (HIDDEN * HIDDEN * 2 + HIDDEN * 1024 * 2 + 3 * HIDDEN * INTER) + VOCAB * HIDDEN)
    per_rank_bytes = 2 * LAYERS * (2 * (HIDDEN + HIDDEN) + 2 * (HIDDEN + 1024) + 3 * (HIDDEN + INTER))
    res["meta"]["base_weight_bytes"] = base_bytes
    res["meta"]["adapter_bytes_per_rank"] = per_rank_bytes

    kc = [torch.randn((64, KV_HEADS, LMAX, HEAD_DIM), device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
    vc = [torch.randn((64, KV_HEADS, LMAX, HEAD_DIM), device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]

    # Correctness: one step at position 0 (empty cache), ours against PEFT's mixed batch.
    with torch.no_grad():
        for mix in ("mixed", "r8"):
            launchers = load_launchers(args.root, mix)
            if mix == "r8":
                ours.pack_random(launchers, mixes["r8"], mix)
            else:
                ours.pack(launchers, names_mixed, mix)
            names = names_mixed
            b = 64
            ids = torch.randint(0, VOCAB, (b,), device=dev)
            pos = torch.zeros((1,), dtype=torch.int64, device=dev)
            kz = [torch.zeros((b, KV_HEADS, LMAX, HEAD_DIM), device=dev, dtype=torch.bfloat16) for _ in range(LAYERS)]
            vz = [torch.zeros_like(kz[0]) for _ in range(LAYERS)]
            meta = make_meta(launchers, b, 64, dev)
            if mix == "mixed":
                mine = ours.step(ids, pos, kz, vz, meta).float()
                theirs = model(input_ids=ids.reshape(b, 1), adapter_names=names).logits[:, -1].float()
                with model.disable_adapter():
                    base_ref = model(input_ids=ids.reshape(b, 1)).logits[:, -1].float()
                mine_base = ours.step(ids, pos, kz, vz, None).float()
                chk = {"ours_vs_peft_rel": float((mine - theirs).norm() / theirs.norm()), "argmax_agree": float((mine.argmax(-1) == theirs.argmax(-1)).float().mean()),
                       "adapter_effect_rel": float((theirs - base_ref).norm() / base_ref.norm()), "ours_base_vs_hf_base_rel": float((mine_base - base_ref).norm() / base_ref.norm()),
                       "ours_base_argmax_agree": float((mine_base.argmax(-1) == base_ref.argmax(-1)).float().mean())}
                res["checks"][mix] = chk
                print("check %s: %s" % (mix, chk), flush=True)
            del kz, vz

            # Timed decode steps, CUDA-graph replay.
            for b in [int(x) for x in args.batches.split(",")] if mix == "mixed" else [64]:
                ids = torch.randint(0, VOCAB, (b,), device=dev)
                pos = torch.full((1,), CONTEXT - 1, dtype=torch.int64, device=dev)
                kb = [t[:b] for t in kc]
                vb = [t[:b] for t in vc]
                meta = make_meta(launchers, b, 64, dev)
                row = {"mix": mix, "batch": b, "adapters": min(b, 64)}
                for mode, m in (("base", None), ("lora", meta)):
                    g, _ = graphed(lambda: ours.step(ids, pos, kb, vb, m))
                    ms = median_ms(g.replay, args.reps)
                    row[mode + "_ms"] = ms
                    row[mode + "_tok_s"] = b * 1000.0 / ms
                    del g
                active = sorted(set(range(b)))
                row["lora_over_base"] = row["lora_ms"] / row["base_ms"]
                row["byte_floor_ratio"] = 1 + sum(ranks_of[mix][i % 64] for i in active) * per_rank_bytes / base_bytes
                res["steps"].append(row)
                print("step %s b=%d: base %.2f ms, 64-adapter %.2f ms (x%.2f; byte floor x%.2f)" % (mix, b, row["base_ms"], row["lora_ms"], row["lora_over_base"], row["byte_floor_ratio"]), flush=True)
                with open(args.out, "w") as f:
                    json.dump(res, f, indent=1)
            torch.cuda.empty_cache()

        # PEFT's mixed batch (adapter_names), eager, with a KV cache of CONTEXT positions.
        for b in [int(x) for x in args.peft_batches.split(",")]:
            names = [names_mixed[i % 64] for i in range(b)]
            prompt = torch.randint(0, VOCAB, (b, CONTEXT - 1), device=dev)
            with model.disable_adapter():
                pre = model(input_ids=prompt, use_cache=True)
            past = pre.past_key_values
            nxt = torch.randint(0, VOCAB, (b, 1), device=dev)
            times = []
            for _ in range(4):
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = model(input_ids=nxt, past_key_values=past, use_cache=True, adapter_names=names)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t) * 1000)
                past = out.past_key_values
            times.sort()
            with model.disable_adapter():
                tb = []
                for _ in range(4):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                    torch.cuda.synchronize()
                    tb.append((time.perf_counter() - t) * 1000)
                    past = out.past_key_values
            tb.sort()
            row = {"batch": b, "peft_mixed_ms": times[len(times) // 2], "hf_base_eager_ms": tb[len(tb) // 2]}
            ours_row = next((r for r in res["steps"] if r["mix"] == "mixed" and r["batch"] == b), None)
            if ours_row is not None:
                row["peft_over_ours"] = row["peft_mixed_ms"] / ours_row["lora_ms"]
            res["peft"].append(row)
            print("peft b=%d: mixed %.1f ms, base eager %.1f ms, peft/ours x%.1f" % (b, row["peft_mixed_ms"], row["hf_base_eager_ms"], row.get("peft_over_ours", float("nan"))), flush=True)
            del pre, past, out
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
