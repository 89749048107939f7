#!/usr/bin/env bash
# Compiles xfabric-kernels' CUDA C with a real NVRTC on a machine without a GPU or toolkit:
# fetches the NVRTC runtime wheel from PyPI once (about 90 MB, kept under the cache directory)
# and runs the NVRTC test against it. Not part of CI (it needs the network the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${NVRTC_WHEEL_VERSION:-13.0.88}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/xfabric/nvrtc-$version"
lib="$cache/nvidia/cu13/lib"
if [ ! -e "$lib/libnvrtc.so.13" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps "nvidia-cuda-nvrtc==$version" -d "$tmp"
    mkdir -p "$cache"
    python3 -m zipfile -e "$tmp"/nvidia_cuda_nvrtc-*.whl "$cache"
fi
# libnvrtc dlopens libnvrtc-builtins from the loader's path, so the directory goes there.
LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test -p xfabric-kernels --test nvrtc -j1 -- --nocapture "$@"
