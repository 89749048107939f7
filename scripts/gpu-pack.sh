#!/usr/bin/env bash
# Packs the GPU checks for a machine with an NVIDIA GPU but no Rust toolchain: builds the test
# binaries that hold GPU tests, the XPU pipeline demo, the GPU IPC bench and the MoE dispatch
# here, strips them into .gpu/ (about 25 MB, ignored by git through .git/info/exclude) with
# scripts/gpu-run.sh beside them. There:
#   bash .gpu/gpu-run.sh   # the GPU tests, xpu_pipeline with a GPU and a CPU XPU, gpu_ipc_bench,
#                          # moe_dispatch (8 minutes at most); figures in $OUT/gpu-figures.txt
# (xpu_gpu, the device API's kernels, prints FIGURE lines, also in $OUT/figures.txt)
# Test logs go to $OUT when it is set. Being ignored by git, .gpu/ travels to a device machine
# only when the run names it (the device tool's `carry: [".gpu"]`).
# The GPU tests are built marked ignored (XFABRIC_GPU_TESTS unset, whatever this shell has) and
# gpu-run.sh runs them with --include-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
rm -rf .gpu && mkdir -p .gpu
export -n XFABRIC_GPU_TESTS 2>/dev/null || true
unset XFABRIC_GPU_TESTS
{
    cargo test -j2 --no-run --message-format=json -p xfabric --test hmem --test hmem_rma \
        --test hmem_trigger --test shm_cuda_ipc
    # The device API's kernels measure latency and rate: the host side built optimized.
    cargo test -j2 --release --no-run --message-format=json -p xfabric --test xpu_gpu
    cargo test -j2 --no-run --message-format=json -p xfabric-kernels --test gpu
    cargo test -j2 --no-run --message-format=json -p xfabric-hmem --test cuda
} 2>/dev/null | python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' |
    while read -r name exe; do cp "$exe" ".gpu/$name" && strip ".gpu/$name"; done
cargo build -j2 --release --example xpu_pipeline --example moe_dispatch --example gpu_ipc_bench
for e in xpu_pipeline moe_dispatch gpu_ipc_bench; do cp "target/release/examples/$e" .gpu/ && strip ".gpu/$e"; done
cp scripts/gpu-run.sh .gpu/
du -sh .gpu
