#!/usr/bin/env bash
# scripts/install.sh [PREFIX] - installs xfabric for C users under PREFIX (default /usr/local):
#   PREFIX/lib/libfabric.so.1.17.0, its soname link libfabric.so.1 and the link libfabric.so
#   PREFIX/include/xfabric/...       xfabric's own headers: the CUDA trigger device functions
#                                    (xfabric_trigger.cuh) and the device API (fi_xpu.h for the
#                                    host calls, fi_xpu_device.h for the device calls, both
#                                    including fi_xpu_abi.h); rdma/ stays libfabric-dev's
#   PREFIX/lib/pkgconfig/libfabric.pc so that `pkg-config --cflags --libs libfabric` finds them
# The libfabric 1.17 API headers (rdma/fabric.h, ...) are libfabric-dev's: the ABI is theirs,
# and a program compiles against them as it would for Debian's library (scripts/setup.sh
# installs them). Run a program against this install with LD_LIBRARY_PATH=PREFIX/lib, or put
# PREFIX/lib in ld.so's path.
#
# Environment: PROFILE=release (default) or debug, the cargo profile built and installed.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}
profile=${PROFILE:-release}
case $profile in
    release) cargo build --release -j2 -p xfabric-capi --lib ;;
    debug) cargo build -j2 -p xfabric-capi --lib ;;
    *) echo "install: PROFILE must be release or debug, not $profile" >&2; exit 2 ;;
esac
target=${CARGO_TARGET_DIR:-target}
lib="$target/$profile/libfabric.so"
[[ -f $lib ]] || { echo "install: $lib was not built" >&2; exit 1; }
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include/xfabric"
install -m 0755 "$lib" "$prefix/lib/libfabric.so.1.17.0"
ln -sfn libfabric.so.1.17.0 "$prefix/lib/libfabric.so.1"
ln -sfn libfabric.so.1 "$prefix/lib/libfabric.so"
install -m 0644 kernels/cuda/*.cuh kernels/cuda/xfabric/*.h "$prefix/include/xfabric/"
url=$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
sed -e "s|@PREFIX@|$prefix|" -e "s|@URL@|$url|" capi/pkgconfig/libfabric.pc.in \
    > "$prefix/lib/pkgconfig/libfabric.pc"
echo "installed xfabric's libfabric.so.1 under $prefix (pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig)"
