#!/usr/bin/env bash
# Installs what building and testing xfabric needs on a fresh Debian machine: a C compiler and
# libfabric's headers (the layout test compiles against them) and libfabric's tools (fi_pingpong,
# fi_info: the reference the benchmarks compare with), and Open MPI (a real C client).
# Idempotent and quiet when all is there.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(gcc)
# objdump and readelf: the C library's export-table test reads them.
command -v objdump >/dev/null 2>&1 || need+=(binutils)
[ -f /usr/include/rdma/fabric.h ] || need+=(libfabric-dev)
command -v fi_pingpong >/dev/null 2>&1 || need+=(libfabric-bin)
# Open MPI: the real client of libfabric.so.1 that capi/tests/mpi.rs runs on xfabric.
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
# pkg-config: the install step's test builds a C program with `pkg-config --libs libfabric`.
command -v pkg-config >/dev/null 2>&1 || need+=(pkgconf)
# verbs: nothing is needed to build (libibverbs is opened at run time). The header lets the
# layout test check our declarations; the rest is the Soft-RoCE VM that the verbs tests boot
# (scripts/rxe-vm.sh: Debian's kernel has rdma_rxe, the host's may not) and ibv_rc_pingpong,
# the reference scripts/bench-verbs.sh compares with.
[ -f /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
for p in qemu-system-x86 linux-image-amd64 busybox-static cpio kmod iproute2 rdma-core \
    ibverbs-providers ibverbs-utils rdmacm-utils; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is required (https://rustup.rs)" >&2; exit 1; }
