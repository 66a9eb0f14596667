"""The peers of the serving run, on the same GPU, checkpoint, adapters and prompts (drive.py's
seeded random ids): transformers `generate` (sdpa, greedy, min_new_tokens = max_new_tokens so no
row stops early) on the base model, PEFT with a mixed batch (`adapter_names`, one adapter per
row), and PEFT with one adapter for the whole batch.

    python3 bench/gpu/serve/peers.py --dir /tmp/serve-model --streams 1,8,32,64 --out peers.json \
        [--mixed-new 32] [--single-streams 1,64]

tokens/s = rows × new tokens ÷ the wall time of `generate` (synchronized), after one warm-up call
per batch size. PEFT's mixed batch loops over adapters per module and is slow, so it generates
--mixed-new tokens (the rate is per token either way; the prefill share grows with fewer tokens,
which flatters nothing of ours).
"""
import argparse
import json
import os
import sys
import time

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from drive import prompts  # noqa: E402


def timed_generate(model, ids, new, **kw):
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, **kw)
    torch.cuda.synchronize()
    return out


def rate(model, ids, new, **kw):
    timed_generate(model, ids[:, :16], 4, **({k: v[: ids.shape[0]] for k, v in kw.items()}))
    t0 = time.perf_counter()
    out = timed_generate(model, ids, new, **kw)
    dt = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + new, out.shape
    return ids.shape[0] * new / dt, out[:, ids.shape[1]:].tolist()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--single-streams", default="1,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--mixed-new", type=int, default=32)
    ap.add_argument("--what", default="base,mixed,single")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    shape = json.load(open(os.path.join(a.dir, "shape.json")))
    vocab = shape["config"]["vocab_size"]
    model = AutoModelForCausalLM.from_pretrained(os.path.join(a.dir, "model"), dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    streams = [int(x) for x in a.streams.split(",")]
    res = {"transformers_base": {}, "peft_mixed": {}, "peft_single": {}, "greedy_base_first_row": None}
    what = a.what.split(",")

    def save():
        # after every measurement: a run cut short by its time limit keeps what it measured
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    with torch.inference_mode():
        if "base" in what:
            for s in streams:
                ids = torch.tensor(prompts(s, a.prompt, vocab), device="cuda")
                r, toks = rate(model, ids, a.new)
                res["transformers_base"][s] = r
                if s == 1:
                    res["greedy_base_first_row"] = toks[0]
                print(f"transformers base  streams {s:3d}: {r:9.1f} tok/s", flush=True)
                save()
        names = sorted(os.listdir(os.path.join(a.dir, "adapters"))) if os.path.isdir(os.path.join(a.dir, "adapters")) else []
        if names and ("mixed" in what or "single" in what):
            from peft import PeftModel
            t0 = time.perf_counter()
            pm = PeftModel.from_pretrained(model, os.path.join(a.dir, "adapters", names[0]), adapter_name=names[0])
            for n in names[1:]:
                pm.load_adapter(os.path.join(a.dir, "adapters", n), adapter_name=n)
            pm.eval()
            print(f"PEFT: {len(names)} adapters loaded in {time.perf_counter() - t0:.1f} s", flush=True)
            if "mixed" in what:
                for s in streams:
                    ids = torch.tensor(prompts(s, a.prompt, vocab), device="cuda")
                    rows = [names[i % len(names)] for i in range(s)]
                    r, _ = rate(pm, ids, a.mixed_new, adapter_names=rows)
                    res["peft_mixed"][s] = r
                    print(f"PEFT mixed         streams {s:3d}: {r:9.1f} tok/s ({a.mixed_new} new tokens)", flush=True)
                    save()
            if "single" in what:
                pm.set_adapter(names[0])
                for s in [int(x) for x in a.single_streams.split(",")]:
                    ids = torch.tensor(prompts(s, a.prompt, vocab), device="cuda")
                    r, _ = rate(pm, ids, a.new)
                    res["peft_single"][s] = r
                    print(f"PEFT one adapter   streams {s:3d}: {r:9.1f} tok/s", flush=True)
                    save()
    save()


if __name__ == "__main__":
    main()
