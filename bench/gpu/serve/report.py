"""Turns a serving run's OUTDIR (run.sh: device.txt, server.json, drive.json, peers.json) into
bench/results/gpu-serve.json (appended, one entry per run) and bench/results/gpu-serve.md (the
newest run first, earlier runs kept below).

    python3 bench/gpu/serve/report.py OUTDIR [--label TEXT] [--commit SHA]
"""
import argparse
import datetime
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "..", "results")


def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def fmt(x, digits=1):
    return "—" if x is None else f"{x:,.{digits}f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--label", default="")
    ap.add_argument("--commit", default="")
    a = ap.parse_args()
    device = open(os.path.join(a.outdir, "device.txt")).read().strip().splitlines()
    server = load(os.path.join(a.outdir, "server.json"), {})
    drive = load(os.path.join(a.outdir, "drive.json"), {"cases": []})
    peers = load(os.path.join(a.outdir, "peers.json"), {})
    replay = load(os.path.join(a.outdir, "replay.json"), {})
    # The JSON keeps the replay's per-case summary; its per-frame times (thousands a run) stay in OUTDIR.
    kept = dict(replay, cases=[{k: v for k, v in c.items() if k != "frames_ms"} for c in replay.get("cases", [])])
    entry = {"date": datetime.date.today().isoformat(), "label": a.label, "commit": a.commit, "device": device,
             "server": server, "drive": drive, "peers": peers, "replay": kept}
    jpath = os.path.join(RESULTS, "gpu-serve.json")
    runs = load(jpath, [])
    runs.append(entry)
    with open(jpath, "w") as f:
        json.dump(runs, f, indent=1)
    by = {(c["kind"], c["streams"]): c for c in drive.get("cases", [])}
    streams = sorted({c["streams"] for c in drive.get("cases", [])})
    tb, pm, ps = peers.get("transformers_base", {}), peers.get("peft_mixed", {}), peers.get("peft_single", {})
    lines = [f"## {entry['date']} — {a.label or 'serving run'}{f' (main at {a.commit})' if a.commit else ''}", "",
             f"Device: {'; '.join(device)}. Shape `{server.get('shape')}`, {server.get('adapters')} adapters r16 on all seven projections; "
             f"{drive.get('prompt')}-token prompts, {drive.get('new')} new tokens, greedy, ignore_eos, one SSE request per stream. "
             f"Extra serve flags: `{server.get('extra_flags') or 'none'}`.", "",
             f"Server ready after **{fmt(server.get('ready_s'))} s**; Node RSS {fmt((server.get('node_rss_ready_kb') or 0) / 2**20, 2)} GiB at ready, "
             f"peak {fmt((server.get('node_rss_peak_kb') or 0) / 2**20, 2)} GiB.", "",
             "| streams | ours base tok/s | transformers base tok/s | ours ÷ transformers | ours adapters tok/s | adapters ÷ our base | PEFT mixed tok/s | ours ÷ PEFT mixed | PEFT one adapter tok/s | TTFT p50 / p99 s (base) | TTFT p50 / p99 s (adapters) | errors |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for s in streams:
        b, d = by.get(("base", s), {}), by.get(("adapters", s), {})
        t, m, p = tb.get(str(s)), pm.get(str(s)), ps.get(str(s))
        ob, oa = b.get("tok_s"), d.get("tok_s")
        lines.append(f"| {s} | {fmt(ob)} | {fmt(t)} | {fmt(ob / t if ob and t else None, 2)} | {fmt(oa)} | {fmt(oa / ob if oa and ob else None, 2)} | "
                     f"{fmt(m)} | {fmt(oa / m if oa and m else None, 1)} | {fmt(p)} | {fmt(b.get('ttft_p50_s'), 2)} / {fmt(b.get('ttft_p99_s'), 2)} | "
                     f"{fmt(d.get('ttft_p50_s'), 2)} / {fmt(d.get('ttft_p99_s'), 2)} | {b.get('errors', 0) + d.get('errors', 0)} |")
    lines.append("")
    alone = [c for c in replay.get("cases", []) if c.get("alone_tok_s")]
    if alone:
        lines += ["Served against the worker alone on the same work (replay.py: the frames the server sent the worker in each case, recorded "
                  "by record.py and sent again to a fresh worker after the server stopped, each as soon as the previous reply arrived; "
                  f"{replay.get('replayed')} frames, {replay.get('failed_count', 0)} replies not ok; recording took "
                  f"{fmt(replay.get('record_write_s'), 2)} s of the served run, {fmt((replay.get('record_bytes') or 0) / 2**30, 2)} GiB). "
                  "Sent one at a time, the frames give the worker no host turnaround to overlap with a step it launched ahead, so where "
                  "served ÷ alone is above 1 the serial replay lost that overlap and is no ceiling; its runs beyond the median are the "
                  "case's prefills, re-stagings and captures:", "",
                  "| case | streams | served tok/s | worker alone tok/s | served ÷ alone | runs | replayed wall ms | median run ms | runs beyond the median, ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        lines += [f"| {c['kind']} | {c['streams']} | {fmt(c['http_tok_s'])} | {fmt(c['alone_tok_s'])} | {fmt(c['http_over_alone'], 2)} | {c['runs']} | "
                  f"{fmt(c['wall_s'] * 1000, 1)} | {fmt(c.get('run_median_ms'), 2)} | {fmt(c.get('over_median_ms'), 1)} |" for c in alone]
        lines.append("")
    worker = [(c["kind"], c["streams"], c) for c in drive.get("cases", []) if c.get("worker_only_tok_s")]
    if worker:
        lines += ["Through HTTP against the worker's busy time on the same work (the torch worker's own time on run requests, frame read to reply written, "
                  "from its `runBusyUs` counter over each case; it leaves out the device time that overlaps the host's turnaround, where a step launched ahead runs on the device, so it need not be a rate the worker alone reaches):", "",
                  "| case | streams | HTTP tok/s | worker-only tok/s | HTTP ÷ worker-only |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {k} | {s} | {fmt(c['tok_s'])} | {fmt(c['worker_only_tok_s'])} | {fmt(c['tok_s'] / c['worker_only_tok_s'], 2)} |" for k, s, c in worker]
        lines.append("")
    split = []
    for c in drive.get("cases", []):
        md = c.get("metrics_delta", {})
        ex = lambda k: md.get('stageml_executor_counter{kind="%s"}' % k)  # noqa: E731
        host = lambda k: md.get('stageml_scheduler_host_seconds{part="%s"}' % k)  # noqa: E731
        runs = ex("runs")
        if not runs or ex("stageUs") is None:
            continue
        per = lambda v: None if v is None else v / runs / 1000  # noqa: E731
        hms = lambda k: None if host(k) is None else host(k) * 1000 / runs  # noqa: E731
        ratio = lambda us, n: None if us is None or not n else us / n / 1000  # noqa: E731
        split.append(f"| {c['kind']} | {c['streams']} | {runs:g} | {fmt(c.get('itl_p50_ms'), 2)} | {fmt(per(ex('runBusyUs')), 2)} | {fmt(per(ex('stageUs')), 2)} | "
                     f"{fmt(per(ex('launchUs')), 2)} | {fmt(per(ex('pickUs')), 2)} | {fmt(per(ex('replyUs')), 2)} | {fmt(per(ex('waitUs')), 2)} | "
                     f"{fmt(ex('ahead'), 0)} / {fmt(ex('aheadHits'), 0)} | {fmt(ex('restages'), 0)} / {fmt(ex('graphEager'), 0)} / {fmt(ex('graphCaptures'), 0)} | "
                     f"{fmt(ex('kernelBuilds') or 0, 0)} / {fmt((ex('kernelBuildUs') or 0) / 1000, 0)} | "
                     f"{fmt(ratio(ex('replayUs'), ex('graphReplays')), 2)} / {fmt(ratio(ex('betweenUs'), ex('betweenN')), 2)} | "
                     f"{fmt(hms('schedule'), 2)} / {fmt(hms('engine'), 2)} / {fmt(hms('emit'), 2)} / {fmt(hms('yield'), 2)} |")
    if split:
        lines += ["Where a run's time goes, per run (ms; the worker's counters and the scheduler's host time over each case): the worker's busy time "
                  "split into staging, launch, picks + commit, reply (on a GPU: the wait for the step), and the time between a reply and the next "
                  "run's request; steps launched ahead / taken; re-stagings / eager steps / captures; kernels built during the case and their build time (ms, whole case); the device's own clock (CUDA events around each replay): ms inside a replayed step and ms from one replayed step's end to the next one's start (picks, commit, and the device waiting for the host); the scheduler's schedule / engine / emit / yield:", "",
                  "| case | streams | runs | inter-token p50 | busy | stage | launch | pick | reply | wait | ahead / hits | restage / eager / capture | builds / ms | device step / between | host schedule / engine / emit / yield |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"] + split + [""]
    engine = {}
    for c in drive.get("cases", []):
        for k, v in c.get("metrics_delta", {}).items():
            if k.startswith("stageml_engine"):
                engine.setdefault(f"{c['kind']} {c['streams']}", {})[k] = v
    if engine:
        lines += ["Engine counters per case (deltas):", ""] + [f"- {k}: " + ", ".join(f"`{n}` {v:g}" for n, v in sorted(vs.items())) for k, vs in engine.items()] + [""]
    mpath = os.path.join(RESULTS, "gpu-serve.md")
    head = "# GPU serving end to end (bench/gpu/serve)\n\nProduced by `bash bench/gpu/serve/run.sh` on the device machine and `bench/gpu/serve/report.py` here; newest run first.\n\n"
    old = ""
    if os.path.exists(mpath):
        old = open(mpath).read()
        old = old[len(head):] if old.startswith(head) else old
    with open(mpath, "w") as f:
        f.write(head + "\n".join(lines) + "\n" + old)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
