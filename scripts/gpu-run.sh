#!/usr/bin/env bash
# Runs in .gpu/ on a machine with an NVIDIA GPU (packed by scripts/gpu-pack.sh): every GPU
# test, then the XPU pipeline demo with a GPU kernel ringing the doorbells and with a CPU XPU,
# then the MoE dispatch with CPU XPUs.
set -o pipefail
cd "$(dirname "$0")"
nvidia-smi -L
nvrtc=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libnvrtc.so*' -print \
    2>/dev/null | grep -v stub | head -1)
echo "libnvrtc: ${nvrtc:-not found}"
[ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUST_BACKTRACE=1
out=${OUT:-.}
rc=0
# XPU_GPU_ONLY=1: only the device API's kernels (xpu_gpu, below).
for t in gpu cuda hmem hmem_rma hmem_trigger shm_cuda_ipc; do
    [ -x "./$t" ] && [ -z "${XPU_GPU_ONLY:-}" ] || continue
    echo "=== $t"
    timeout 120 "./$t" --ignored gpu_ --test-threads=1 2>&1 | tee "$out/$t.log" | tail -25 || rc=1
done
# The device API's kernels: send path, put with signal, latency and rate, with their figures
# (kernel send -> peer completion p50, descriptors/s from one block) and the card and driver.
if [ -x ./xpu_gpu ]; then
    echo "=== xpu_gpu"
    timeout 180 ./xpu_gpu --ignored gpu_xpu --test-threads=1 --nocapture 2>&1 |
        tee "$out/xpu_gpu.log" | grep -E 'FIGURE|^test |test result|panicked|GPU 0' || rc=1
    {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        grep FIGURE "$out/xpu_gpu.log"
    } >"$out/figures.txt" 2>&1
    cat "$out/figures.txt"
fi
[ -n "${XPU_GPU_ONLY:-}" ] && exit $rc
for x in gpu cpu; do
    echo "=== xpu_pipeline --xpu $x"
    timeout 60 ./xpu_pipeline --xpu "$x" 2>&1 | tee "$out/xpu_pipeline_$x.log" | tail -15 || rc=1
done
# The MoE dispatch with CPU XPUs: on a machine with a core for each rank's XPU and host
# threads, the device way's overlap has idle time to reclaim (issue 31's goal: <= 0.70).
echo "=== moe_dispatch --ranks 4"
timeout 60 ./moe_dispatch --ranks 4 --rounds 9 2>&1 | tee "$out/moe_dispatch.log" | tail -14 || rc=1
exit $rc
