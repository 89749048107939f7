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
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "setup: installing ${need[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "setup: cargo is required (https://rustup.rs)" >&2; exit 1; }
