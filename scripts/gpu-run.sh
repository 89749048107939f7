#!/usr/bin/env bash
# Runs in .gpu/ on a machine with an NVIDIA GPU (packed by scripts/gpu-pack.sh): every GPU
# test, then the XPU pipeline demo with a GPU kernel and with a CPU XPU (both ways each round),
# the GPU IPC bench (two processes over shm, device memory on both sides), then the MoE
# dispatch with CPU XPUs. The whole run stays within 8 minutes: each step's
# timeout is cut to what is left of them. Logs and $OUT/gpu-figures.txt (the card, the driver,
# the date, each figure with its goal and met / NOT met) go to $OUT when it is set.
set -o pipefail
cd "$(dirname "$0")"
nvidia-smi -L
# NVRTC: an NVRTC newer than the driver compiles PTX the driver refuses, and an old one may not
# know the card's architecture. So: the newest copy on this machine (any mount; the loader's
# own first among equals) whose version is at most the CUDA version the driver supports.
driver_cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -1)
nvrtc_version() { # libnvrtc.so.12.4.127 -> 12.4, libnvrtc.so.13 -> 13
    basename "$(readlink -f "$1")" | sed -n 's/^libnvrtc\.so\.\([0-9]*\(\.[0-9]*\)\{0,1\}\).*/\1/p'
}
nvrtc=
while read -r c; do
    v=$(nvrtc_version "$c")
    [ -n "$v" ] || continue
    if [ -z "$driver_cuda" ] ||
        [ "$(printf '%s\n%s\n' "$v" "$driver_cuda" | sort -V | tail -1)" = "$driver_cuda" ]; then
        nvrtc=$c
        break
    fi
done < <({
    ldconfig -p 2>/dev/null | awk '/libnvrtc\.so\./ {print $NF}'
    find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name 'libnvrtc.so.*' -print \
        2>/dev/null
} | grep -v -e stub -e builtins | awk '!seen[$0]++' |
    while read -r c; do echo "$(nvrtc_version "$c") $c"; done | sort -s -k1,1 -V -r | cut -d' ' -f2-)
echo "driver's CUDA: ${driver_cuda:-unknown}; libnvrtc: ${nvrtc:-none at most that version}"
[ -n "$nvrtc" ] && export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUST_BACKTRACE=1
out=${OUT:-.}
budget=480
rc=0
# XPU_GPU_ONLY=1: only the device API's kernels (xpu_gpu, below).
# A step's timeout: its own, or what is left of the budget if that is less (at least 1 s).
limit() {
    local left=$((budget - SECONDS))
    [ "$left" -lt 1 ] && left=1
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
figures="$out/gpu-figures.txt"
{
    echo "xfabric GPU figures"
    echo "date:   $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "card:   $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
    echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo "nvrtc:  ${nvrtc:-not found}"
} >"$figures"
# figure NAME LOG: the log's verdict line, met where it says the goal was reached.
figure() {
    local v
    v=$(grep -m1 '^verdict:' "$2" | sed 's/^verdict: //')
    if [ -z "$v" ]; then
        echo "$1: no figure (the run failed or timed out: see $(basename "$2"))"
    elif grep -q 'NOT shown' <<<"$v"; then
        echo "$1: $v [NOT met]"
    else
        echo "$1: $v [met]"
    fi >>"$figures"
    # When the transfers ran against the compute (and the note if they waited for its end).
    grep -E '^  (triggered, from the XPU|NOTE: )' "$2" | sed "s|^ *|$1: |" >>"$figures" || true
}
for t in gpu cuda hmem hmem_rma hmem_trigger shm_cuda_ipc; do
    [ -x "./$t" ] && [ -z "${XPU_GPU_ONLY:-}" ] || continue
    echo "=== $t"
    # --include-ignored: the GPU tests run whether or not the packing build marked them ignored.
    timeout "$(limit 90)" "./$t" --include-ignored gpu_ --test-threads=1 2>&1 | tee "$out/$t.log" | tail -25 || rc=1
    echo "test $t: $(grep -m1 '^test result:' "$out/$t.log" || echo 'no result (failed or timed out)')" >>"$figures"
    # A run that selected nothing checked nothing: a failure, not a pass.
    if grep -q '^test result: ok\. 0 passed' "$out/$t.log"; then
        echo "test $t: no GPU test ran [NOT met]" >>"$figures"
        rc=1
    fi
done
# The device API's kernels: send path, put with signal, latency and rate, with their figures
# (kernel send -> peer completion p50, descriptors/s from one block) and the card and driver.
if [ -x ./xpu_gpu ]; then
    echo "=== xpu_gpu"
    timeout "$(limit 150)" ./xpu_gpu --include-ignored gpu_xpu --test-threads=1 --nocapture 2>&1 |
        tee "$out/xpu_gpu.log" | grep -E 'FIGURE|^test |test result|panicked|GPU 0' || rc=1
    {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        grep FIGURE "$out/xpu_gpu.log"
    } >"$out/figures.txt" 2>&1
    cat "$out/figures.txt"
    grep FIGURE "$out/xpu_gpu.log" | sed 's/^/xpu_gpu: /' >>"$figures"
    if ! grep -q '^test result: ok\. [1-9]' "$out/xpu_gpu.log"; then
        echo "xpu_gpu: no passing run of the device API's kernels [NOT met]" >>"$figures"
        rc=1
    fi
fi
[ -n "${XPU_GPU_ONLY:-}" ] && exit $rc
for x in gpu cpu; do
    echo "=== xpu_pipeline --xpu $x"
    timeout "$(limit 60)" ./xpu_pipeline --xpu "$x" --rounds 9 2>&1 | tee "$out/xpu_pipeline_$x.log" | tail -20 || rc=1
    figure "xpu_pipeline --xpu $x (triggered/ordinary)" "$out/xpu_pipeline_$x.log"
done
# CUDA IPC over shm between two processes on this GPU: its three figures, each with its goal.
echo "=== gpu_ipc_bench"
timeout "$(limit 90)" ./gpu_ipc_bench 2>&1 | tee "$out/gpu_ipc_bench.log" | tail -8 || rc=1
grep '^figure: ' "$out/gpu_ipc_bench.log" | sed 's/^figure: /gpu_ipc_bench: /' >>"$figures" ||
    echo "gpu_ipc_bench: no figures (the run failed or timed out: see gpu_ipc_bench.log)" >>"$figures"
# Small messages by IPC too (the threshold down to 8 B) against the staging above: which is
# faster below XFABRIC_SHM_IPC_MIN is decided by this pair of latency figures.
echo "=== gpu_ipc_bench, IPC from 8 B"
XFABRIC_SHM_IPC_MIN=8 timeout "$(limit 60)" ./gpu_ipc_bench --rounds 1 2>&1 |
    tee "$out/gpu_ipc_bench_small.log" | tail -3 || rc=1
grep '^figure: 8 B' "$out/gpu_ipc_bench_small.log" |
    sed 's/^figure: /gpu_ipc_bench, XFABRIC_SHM_IPC_MIN=8: /' >>"$figures" ||
    echo "gpu_ipc_bench, XFABRIC_SHM_IPC_MIN=8: no figure (see gpu_ipc_bench_small.log)" >>"$figures"
# The MoE dispatch with CPU XPUs: on a machine with a core for each rank's XPU and host
# threads, the device way's overlap has idle time to reclaim (issue 31's goal: <= 0.70).
echo "=== moe_dispatch --ranks 4"
timeout "$(limit 60)" ./moe_dispatch --ranks 4 --rounds 9 2>&1 | tee "$out/moe_dispatch.log" | tail -14 || rc=1
figure "moe_dispatch --ranks 4 (device/host, CPU XPUs)" "$out/moe_dispatch.log"
echo "elapsed: ${SECONDS} s of ${budget}" >>"$figures"
echo "=== figures ($figures)"
cat "$figures"
exit $rc
