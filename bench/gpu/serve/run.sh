#!/usr/bin/env bash
# The GPU end-to-end serving run as one device command, from the repository root with .gpu/serve
# carried (bench/gpu/serve/prepare.mjs writes it): generate a random bf16 checkpoint and N PEFT
# adapters, start `stageml serve --executor torch` on them, drive it over HTTP (drive.py), then the
# peers on the same GPU (peers.py). Everything lands in OUTDIR; report.py turns it into
# bench/results/gpu-serve.{json,md} here.
#   bash bench/gpu/serve/run.sh OUTDIR [SHAPE=1b] [ADAPTERS=64] [STREAMS=1,8,32,64] [-- extra serve flags]
# Environment: PEERS=0 (no peers), PREFILL_PROF=1 (the CUDA profiler on the worker's prefill runs), PEER_WHAT=base,mixed,single, PEER_STREAMS (default STREAMS), PEER_BUDGET (s),
# RECORD=0 (no worker-alone replay; on by default where no other worker wrapper below is on).
set -u
OUTDIR=${1:?output directory}; SHAPE=${2:-1b}; NADAPT=${3:-64}; STREAMS=${4:-1,8,32,64}
shift $(( $# < 4 ? $# : 4 )); [ "${1:-}" = "--" ] && shift
EXTRA=("$@")
ROOT=$PWD
WORK=${SERVE_WORK:-/tmp/serve-e2e}
PORT=8011
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
mkdir -p "$OUTDIR" "$WORK"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUTDIR/device.txt"
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)" | tee -a "$OUTDIR/device.txt"
[ -x "$WORK/node" ] || xz -dc .gpu/serve/node.xz > "$WORK/node" && chmod +x "$WORK/node"
"$WORK/node" --version | tee -a "$OUTDIR/device.txt"
T0=$(date +%s)
if [ ! -f "$WORK/$SHAPE-$NADAPT/shape.json" ]; then
  python3 bench/gpu/serve/gen.py --shape "$SHAPE" --adapters "$NADAPT" --out "$WORK/$SHAPE-$NADAPT" 2>&1 | grep -v Warning | tee "$OUTDIR/gen.log"
fi
DIR=$WORK/$SHAPE-$NADAPT
echo "generated after $(( $(date +%s) - T0 )) s"
VOCAB=$(python3 -c "import json;print(json.load(open('$DIR/shape.json'))['config']['vocab_size'])")
ADAPT_FLAGS=(); NAMES=""
if [ "$NADAPT" -gt 0 ]; then
  ADAPT_FLAGS=(--adapters "$DIR/adapters" --max-loras "$NADAPT" --max-lora-rank 16)
  NAMES=$(ls "$DIR/adapters" | paste -sd, -)
fi
# PROFILE=1: Node's CPU profile (--cpu-prof) and the torch worker under cProfile, both written at
# shutdown under OUTDIR/prof (summarize with bench/gpu/serve/profile_summary.py).
# Each mode runs the torch worker under a wrapper: `wrap_worker NAME COMMAND` writes $WORK/python-NAME,
# an interpreter that runs COMMAND (followed by the worker's own arguments) in place of
# `python3 -m stageml_torch.worker` and plain python3 otherwise, and makes it the executor's
# STAGEML_PYTHON (the last mode set wins).
wrap_worker() {
  printf '#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = stageml_torch.worker ]; then shift 2; exec %s "$@"; fi\nexec python3 "$@"\n' "$2" > "$WORK/python-$1"
  chmod +x "$WORK/python-$1"
  export STAGEML_PYTHON="$WORK/python-$1"
}
NODE_FLAGS=()
if [ "${PROFILE:-0}" = 1 ]; then
  mkdir -p "$OUTDIR/prof"
  NODE_FLAGS=(--cpu-prof --cpu-prof-dir="$OUTDIR/prof")
  wrap_worker prof "python3 -m cProfile -o '$OUTDIR/prof/worker.prof' -m stageml_torch.worker"
fi
# SYNC_DEBUG=1: the torch worker under sync_debug.py (each host wait for the device, once per call
# stack, in server.log as "sync-debug: ...").
if [ "${SYNC_DEBUG:-0}" = 1 ]; then wrap_worker sync "python3 '$PWD/bench/gpu/serve/sync_debug.py'"; fi
# TRACE=1: the torch worker under trace.py (one JSON line per run in OUTDIR/trace.jsonl; summarize
# with bench/gpu/serve/trace_summary.py).
if [ "${TRACE:-0}" = 1 ]; then wrap_worker trace "env TRACE_OUT='$OUTDIR/trace.jsonl' python3 '$PWD/bench/gpu/serve/trace.py'"; fi
# PREFILL_PROF=1: the torch worker under prefill_prof.py (the CUDA profiler on its first prefill runs
# and two decode runs after them: device kernel time against the wall, the top kernels; in
# OUTDIR/prefill-prof.txt).
if [ "${PREFILL_PROF:-0}" = 1 ]; then wrap_worker pprof "env PREFILL_PROF_OUT='$OUTDIR/prefill-prof.txt' python3 '$PWD/bench/gpu/serve/prefill_prof.py'"; fi
# RECORD=1 (default): the worker under record.py (every request frame kept under $WORK/record), then,
# after the server stopped, replay.py sends the same frames to a fresh worker with nothing around it:
# the worker alone on the served work, per case (OUTDIR/replay.json).
RECORD=${RECORD:-1}
if [ "${STAGEML_PYTHON:-}" != "" ]; then RECORD=0; fi
if [ "$RECORD" = 1 ]; then
  # In memory where /dev/shm has room for the adapters' frames (~3 GB for 64 adapters of the 1B
  # shape; a container's default /dev/shm is 64 MB), else on disk beside the checkpoint.
  SHM_FREE=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')
  if [ "${SHM_FREE:-0}" -gt $((16 * 1024 * 1024)) ]; then REC=${RECORD_DIR:-/dev/shm/stageml-record}; else REC=${RECORD_DIR:-$WORK/record}; fi
  rm -rf "$REC"; mkdir -p "$REC"
  wrap_worker record "env RECORD_DIR='$REC' python3 '$PWD/bench/gpu/serve/record.py'"
fi
S0=$(date +%s.%N)
"$WORK/node" "${NODE_FLAGS[@]}" .gpu/serve/stageml.mjs serve "$DIR/model" --served-model-name base --executor torch --port $PORT \
  --max-batch 64 "${ADAPT_FLAGS[@]}" "${EXTRA[@]}" > >(python3 -u bench/gpu/serve/stamp.py "$S0" > "$OUTDIR/server.log") 2>&1 &
SPID=$!
READY=""
for _ in $(seq 1 1200); do
  if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/v1/models', timeout=2)" > /dev/null 2>&1; then READY=$(python3 -c "print(f'{$(date +%s.%N) - $S0:.1f}')"); break; fi
  kill -0 $SPID 2>/dev/null || break
  sleep 0.5
done
RSS_READY=$(awk '/VmRSS/{print $2}' /proc/$SPID/status 2>/dev/null)
echo "server ready after ${READY:-never} s, node RSS ${RSS_READY:-?} kB"
if [ -z "$READY" ]; then tail -30 "$OUTDIR/server.log"; kill $SPID 2>/dev/null; exit 1; fi
python3 bench/gpu/serve/drive.py --url "http://127.0.0.1:$PORT" --base base --adapters "$NAMES" --streams "$STREAMS" \
  --vocab "$VOCAB" --out "$OUTDIR/drive.json" 2>&1 | tee "$OUTDIR/drive.log"
RSS_PEAK=$(awk '/VmHWM/{print $2}' /proc/$SPID/status 2>/dev/null)
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" > "$OUTDIR/metrics.txt"
kill -INT $SPID; wait $SPID 2>/dev/null
python3 - "$OUTDIR/server.json" <<PY
import json, sys
json.dump({"shape": "$SHAPE", "adapters": $NADAPT, "ready_s": float("$READY"), "node_rss_ready_kb": int("${RSS_READY:-0}"),
           "node_rss_peak_kb": int("${RSS_PEAK:-0}"), "extra_flags": "${EXTRA[*]}"}, open(sys.argv[1], "w"))
PY
if [ "$RECORD" = 1 ]; then
  unset STAGEML_PYTHON
  python3 bench/gpu/serve/replay.py --record "$REC" --drive "$OUTDIR/drive.json" --out "$OUTDIR/replay.json" 2>&1 | tee "$OUTDIR/replay.log"
  rm -rf "$REC"
fi
if [ "${PEERS:-1}" = 1 ]; then
  timeout "${PEER_BUDGET:-300}" python3 bench/gpu/serve/peers.py --dir "$DIR" --streams "${PEER_STREAMS:-$STREAMS}" --out "$OUTDIR/peers.json" \
    ${PEER_WHAT:+--what $PEER_WHAT} 2>&1 | grep -v -i warn | tee "$OUTDIR/peers.log"
fi
echo "total $(( $(date +%s) - T0 )) s"
