"""The stub worker (`python3 -m stageml_torch.worker` with this directory first on PYTHONPATH).

Answers `hello` as a CUDA device (so the host takes its GPU defaults: device picks, a GPU token
budget), accepts `load`/`alloc`/`write`/`prepare`/`cache_drop`/`cache_fork`/`cache_keep`/`dispose` without doing anything,
and answers `run` with one token per row for every `argmax`/`sample` output: a deterministic
function of the row's last input id in [3, STAGEML_STUB_VOCAB) (so a tokenizer of that size
detokenizes it), after sleeping STAGEML_STUB_KERNEL_MS milliseconds (a device's step time, 0 by
default). Other outputs are not produced (a host that asks for logits gets RT_UNSUPPORTED_OP).
Each reply carries `stats.stubMs`, the milliseconds the stub spent between reading a request and
writing its reply, summed (reading, JSON and writing included; the sleep excluded).
"""

import argparse
import importlib.util
import os
import sys
import time


def _real_protocol():
    real = os.environ["STAGEML_STUB_REAL_PATH"]
    spec = importlib.util.spec_from_file_location("stageml_torch_real", os.path.join(real, "__init__.py"), submodule_search_locations=[real])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["stageml_torch_real"] = pkg
    spec.loader.exec_module(pkg)
    from stageml_torch_real import protocol  # noqa: E402

    return protocol


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.parse_args()
    protocol = _real_protocol()
    import torch

    kernel = float(os.environ.get("STAGEML_STUB_KERNEL_MS", "0")) / 1000.0
    vocab = int(os.environ.get("STAGEML_STUB_VOCAB", "512"))
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    handles = 0
    stub_s = 0.0
    runs = 0
    while True:
        frame = protocol.read_frame(inp)
        if frame is None:
            return 0
        t0 = time.perf_counter()
        header, tensors = frame
        op = header.get("op")
        reply, outs = {"ok": True}, None
        if op == "hello":
            reply.update(protocol=6, worker="stub", torch=torch.__version__, device="cuda:0", cuda=True, deviceName="stub (no device)", memory={"total": 80 << 30, "free": 79 << 30})
        elif op == "prepare":
            handles += 1
            reply["handle"] = handles
        elif op == "run":
            ids = tensors.get("input_ids")
            last = ids[:, -1].to(torch.int64) if ids is not None and ids.dim() == 2 else torch.zeros(1, dtype=torch.int64)
            picks = 3 + (last * 31 + 7) % (vocab - 3)
            outs = {name: picks.clone() for name in list(header.get("argmax") or []) + list((header.get("sample") or {}).keys())}
            runs += 1
            if kernel > 0:
                stub_s += time.perf_counter() - t0
                time.sleep(kernel)
                t0 = time.perf_counter()
        elif op == "shutdown":
            protocol.write_frame(out, {"ok": True, "id": header.get("id")})
            return 0
        reply["id"] = header.get("id")
        if op == "run":
            stub_s += time.perf_counter() - t0
            reply["stats"] = {"stubMs": stub_s * 1000.0, "stubCpuMs": time.process_time() * 1000.0, "stubRuns": runs}
            t0 = time.perf_counter()
        protocol.write_frame(out, reply, outs)
        stub_s += time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
