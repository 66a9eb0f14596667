#!/usr/bin/env bash
# Installs the Debian packages the test suite uses as external oracles and peers, when missing:
#   mlir-19-tools, libmlir-19  mlir-opt-19 / mlir-cpu-runner-19 verify and run the MLIR lowering
#   haproxy                    the load balancer `stageml cluster` starts (scale-out tests)
#   python3-torch              CPU torch for the torch executor's worker (protocol, ops, goldens)
#   g++                        builds the cpu-native kernels from source (the prebuilt-vs-source test; elsewhere than linux-x64)
# Runs apt-get as root, or through sudo when not root. Tests that need these fail (never skip) in
# CI when they are missing, so a failed install is reported here, loudly.
set -euo pipefail
need=()
command -v mlir-opt-19 >/dev/null 2>&1 || need+=(mlir-19-tools)
ls /usr/lib/llvm-19/lib/libmlir_runner_utils.so* >/dev/null 2>&1 || need+=(libmlir-19)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
python3 -c 'import torch' >/dev/null 2>&1 || /usr/bin/python3 -c 'import torch' >/dev/null 2>&1 || need+=(python3-torch)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if [ ${#need[@]} -eq 0 ]; then
  echo "test dependencies: all present"
  exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
    echo "error: installing ${need[*]} needs root (or sudo)" >&2
    exit 1
  fi
fi
echo "test dependencies: installing ${need[*]} (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${need[@]}" >/dev/null
echo "test dependencies: installed ${need[*]}"
