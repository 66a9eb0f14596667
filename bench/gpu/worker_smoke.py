"""The torch worker process on CUDA, driven over its stdio protocol exactly as the TypeScript
executor drives it (hello, prepare with the graph JSON and parameter tensors, run, dispose,
shutdown), on the bf16 fixture bundle: outputs equal `Program.run` in-process, and the round trip
per decode step (host tensors in and out, as the engine passes the KV cache today) is timed.

    python3 bench/gpu/worker_smoke.py --root DIR --out worker.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.root, "native"))
    from stageml_torch.bundle import load_bundle
    from stageml_torch.protocol import read_frame, write_frame
    from stageml_torch.safetensors_io import read_safetensors

    bdir = os.path.join(args.root, "bundles", "fixture-bf16")
    graph = json.load(open(os.path.join(bdir, "residual.json")))
    params = read_safetensors(os.path.join(bdir, "constants.safetensors"))
    env = dict(os.environ, PYTHONPATH=os.path.join(args.root, "native"))
    p = subprocess.Popen([sys.executable, "-m", "stageml_torch.worker", "--device", args.device], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def call(header, tensors=None):
        write_frame(p.stdin, header, tensors)
        return read_frame(p.stdout)

    res = {"hello": call({"op": "hello", "id": 1})[0]}
    t0 = time.time()
    rep, _ = call({"op": "prepare", "id": 2, "graph": graph}, params)
    res["prepare"] = rep
    res["prepare_s"] = time.time() - t0
    h = rep["handle"]
    ids = [1, 5, 9, 200, 33, 7, 77, 12]
    t = len(ids)

    def inputs(tokens, past_len, past):
        x = {"input_ids": torch.tensor([tokens]), "position_ids": torch.arange(past_len, past_len + len(tokens)).reshape(1, -1),
             "attention_mask": torch.zeros((1, past_len + len(tokens)))}
        x.update(past)
        return x

    past = {("past_%s.%d" % (kv, l)): torch.zeros((1, 2, 0, 16)) for kv in ("key", "value") for l in range(2)}
    rep, out = call({"op": "run", "id": 3, "handle": h}, inputs(ids, 0, past))
    direct = load_bundle(bdir, args.device).run({k: v.to(args.device) for k, v in inputs(ids, 0, past).items()})
    res["run_ok"] = rep["ok"]
    res["logits_max_abs_diff_vs_in_process"] = float((out["logits"] - direct["logits"].cpu()).abs().max())
    # Decode steps over the protocol: KV in and out as host tensors, as the engine does today.
    steps = []
    past = {("past_%s.%d" % (kv, l)): out["present_%s.%d" % (kv, l)] for kv in ("key", "value") for l in range(2)}
    nxt = int(out["logits"][0, -1].argmax())
    for s in range(20):
        t1 = time.perf_counter()
        rep, out = call({"op": "run", "id": 10 + s, "handle": h}, inputs([nxt], t + s, past))
        steps.append((time.perf_counter() - t1) * 1000)
        past = {("past_%s.%d" % (kv, l)): out["present_%s.%d" % (kv, l)] for kv in ("key", "value") for l in range(2)}
        nxt = int(out["logits"][0, -1].argmax())
    steps.sort()
    res["decode_step_roundtrip_ms_median"] = steps[len(steps) // 2]
    res["bad_handle"] = call({"op": "run", "id": 99, "handle": 12345})[0]
    res["dispose"] = call({"op": "dispose", "id": 100, "handle": h})[0]
    res["shutdown"] = call({"op": "shutdown", "id": 101})[0]
    res["exit_code"] = p.wait(timeout=30)
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
