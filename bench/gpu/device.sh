#!/usr/bin/env bash
# The whole GPU run, as one device command: environment check, the extension build, the Triton
# bench, the CUDA bench, the reports. Nothing else runs while timing (the build is done first).
# Usage (on the GPU machine, repo root, bench/gpu/out carried): bash bench/gpu/device.sh OUTDIR
set -u
OUTDIR=${1:?output directory}
export PYTHONUNBUFFERED=1 MAX_JOBS=16
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
START=$(date +%s)
timeout "${BUILD_BUDGET:-240}" python3 -X faulthandler native/build.py bench/gpu/out/cuda/* --build-dir /tmp/stageml-build > "$OUTDIR/build.log" 2>&1
echo "build exit $? after $(( $(date +%s) - START )) s"; tail -4 "$OUTDIR/build.log"
if [ -z "${SKIP_TRITON:-}" ]; then
  TRITON_PRINT_AUTOTUNING=1 timeout "${TRITON_BUDGET:-300}" python3 bench/gpu/run_triton.py --out "$OUTDIR/triton.json" --timeout 120 ${TRITON_CASES:+--cases $TRITON_CASES} > "$OUTDIR/triton.log" 2>&1
  echo "triton exit $? after $(( $(date +%s) - START )) s"; grep -E "^== |FAILED" "$OUTDIR/triton.log"
fi
if [ -z "${SKIP_CUDA:-}" ]; then
  timeout "${CUDA_BUDGET:-200}" python3 -X faulthandler bench/gpu/bench_cuda.py --out "$OUTDIR/sm90.json" --build-dir /tmp/stageml-build ${CUDA_CASES:+--cases $CUDA_CASES} > "$OUTDIR/cuda.log" 2>&1
  echo "cuda exit $? after $(( $(date +%s) - START )) s"; grep -v "^  " "$OUTDIR/cuda.log" | tail -40
fi
python3 bench/gpu/report.py "$OUTDIR/triton.json" "$OUTDIR/sm90.json" --out-dir "$OUTDIR"
