#!/usr/bin/env bash
# The kernel benchmark as one device command (what bench/results/gpu-kernels.md's calls ran): the
# wgmma ring / shrink-expand smoke, the sweep against cuBLAS with the fastest configurations
# written out, the shipped dispatch without cubins (NVRTC), and the Llama-3-8B decode step.
# Build the cubins here first (no parallel nvcc): /usr/bin/python3 bench/gpu/build_wg.py DIR --stream
# Usage (on the GPU machine, repo root; DIR carried): bash bench/gpu/device-kernels.sh DIR OUTDIR
set -u
CUB=${1:?cubin directory}
OUTDIR=${2:?output directory}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,memory.used,driver_version --format=csv,noheader
S=$(date +%s)
timeout 120 python3 bench/gpu/wg_smoke.py --shipped > "$OUTDIR/shipped.log" 2>&1; echo "shipped (NVRTC) exit $? after $(( $(date +%s) - S )) s"
export STAGEML_STREAM_CUBIN_0=$CUB/lora_stream_0.cubin STAGEML_TMA_CUBIN=$CUB/lora_wg.cubin
timeout 120 python3 bench/gpu/wg_smoke.py > "$OUTDIR/smoke.log" 2>&1; echo "smoke exit $? after $(( $(date +%s) - S )) s"
timeout 240 python3 bench/gpu/splitk.py --out "$OUTDIR/gpu-kernels.json" --no-triton --triton-one --sweep old1,cl,tmadef,wg,sx \
  --rows 1,16,32,64,128,256 --bank-rows 1,16,32,64,128,256 --write-configs "$OUTDIR/stream-configs.json" > "$OUTDIR/kernels.log" 2>&1
echo "kernels exit $? after $(( $(date +%s) - S )) s"; grep -E "^configs" "$OUTDIR/kernels.log"
unset STAGEML_STREAM_CUBIN_0 STAGEML_TMA_CUBIN
timeout 200 python3 bench/gpu/decode8b.py --kernel stream --out "$OUTDIR/decode8b.json" --reps 10 > "$OUTDIR/decode.log" 2>&1
echo "decode exit $? after $(( $(date +%s) - S )) s"; grep -v "^ " "$OUTDIR/decode.log" | tail -10
# then, here: python3 bench/gpu/splitk.py --report OUTDIR/gpu-kernels.json --out TABLES.md
