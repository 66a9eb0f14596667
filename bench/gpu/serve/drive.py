"""Drives a running `stageml serve` over HTTP as clients would: S concurrent streams, each one
completion request (SSE) of a P-token prompt (token ids) and N new tokens, greedy, ignore_eos.
Base rows ask for the served base model; adapter rows spread over the adapters, one per stream.

    python3 bench/gpu/serve/drive.py --url http://127.0.0.1:8000 --streams 1,8,32,64 \
        --prompt 128 --new 128 --out drive.json [--adapters a00,a01,...] [--vocab 128256]

Per case: aggregate tokens/s (all streams' tokens ÷ wall time from the first request to the last
[DONE]), time to first token p50/p99, inter-token p50, errors. Prompts are random ids drawn from a
fixed seed (the same for every case and for the peers in peers.py).
"""
import argparse
import asyncio
import json
import random
import statistics
import time

import aiohttp


def prompts(n, length, vocab, seed=7):
    r = random.Random(seed)
    return [[r.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


async def one(session, url, model, ids, new):
    body = {"model": model, "prompt": ids, "max_tokens": new, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    stamps = []
    count = 0
    async with session.post(f"{url}/v1/completions", json=body) as r:
        if r.status != 200:
            return {"error": f"{r.status} {(await r.text())[:200]}"}
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                return {"error": json.dumps(ev["error"])[:200]}
            usage = ev.get("usage")
            if usage:
                count = usage.get("completion_tokens", count)
            if not ev.get("choices") or not ev["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if first is None:
                first = now - t0
            stamps.append(now)
    return {"ttft": first, "end": time.perf_counter(), "start": t0, "stamps": stamps, "tokens": count or len(stamps)}


async def case(url, models, streams, plen, new, vocab):
    ps = prompts(streams, plen, vocab)
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        t0_unix = time.time()
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one(s, url, models[i % len(models)], ps[i], new) for i in range(streams)))
        wall = time.perf_counter() - t0
        t1_unix = time.time()
    errors = [r["error"] for r in res if "error" in r]
    ok = [r for r in res if "error" not in r]
    tokens = sum(r["tokens"] for r in ok)
    ttft = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
    gaps = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None
    return {"streams": streams, "tokens": tokens, "wall_s": wall, "t0_unix": t0_unix, "t1_unix": t1_unix, "tok_s": tokens / wall if wall > 0 else 0,
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p99_s": pct(ttft, 0.99), "itl_p50_ms": (statistics.median(gaps) * 1e3) if gaps else None,
            "errors": len(errors), "first_error": errors[0] if errors else None}


async def metrics(url):
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
        keep = {}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name = line.split("{")[0].split(" ")[0]
            if name.startswith("stageml_engine") or name.startswith("stageml_executor") or name.startswith("stageml_scheduler") or name.startswith("vllm:"):
                try:
                    keep[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
                except ValueError:
                    pass
        return keep
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--streams", default="1,8,32,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--base", required=True, help="the served base model name")
    ap.add_argument("--adapters", default="", help="comma-separated adapter names (empty: base only)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    adapters = [x for x in a.adapters.split(",") if x]
    out = {"prompt": a.prompt, "new": a.new, "cases": []}
    kinds = [("base", [a.base])] + ([("adapters", adapters)] if adapters else [])
    for kind, models in kinds:
        for _ in range(a.warmup):
            await case(a.url, models, min(8, len(models) * 8), a.prompt, 8, a.vocab)
        for s in [int(x) for x in a.streams.split(",")]:
            m0 = await metrics(a.url)
            r = await case(a.url, models, s, a.prompt, a.new, a.vocab)
            m1 = await metrics(a.url)
            r["kind"] = kind
            r["metrics_delta"] = {k: m1[k] - m0.get(k, 0) for k in m1 if isinstance(m1.get(k), float) and m1[k] != m0.get(k, 0)}
            # The worker's own time on this case's runs (frame read to reply written): the rate the
            # worker alone sustains on the same batch, and the share of the wall it was busy.
            busy = r["metrics_delta"].get('stageml_executor_counter{kind="runBusyUs"}')
            if busy:
                r["worker_busy_s"] = busy / 1e6
                r["worker_only_tok_s"] = r["tokens"] / r["worker_busy_s"]
                r["http_over_worker"] = r["worker_busy_s"] / r["wall_s"]
            out["cases"].append(r)
            print(f"{kind:9s} streams {s:3d}: {r['tok_s']:9.1f} tok/s  ttft p50 {r['ttft_p50_s']} p99 {r['ttft_p99_s']}  itl p50 {r['itl_p50_ms']} ms  worker-only {r.get('worker_only_tok_s', 0):9.1f} tok/s (http/worker {r.get('http_over_worker', 0):.2f})  errors {r['errors']} {r['first_error'] or ''}", flush=True)
            with open(a.out, "w") as f:
                json.dump(out, f, indent=1)


if __name__ == "__main__":
    asyncio.run(main())
