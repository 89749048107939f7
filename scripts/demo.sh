#!/usr/bin/env bash
# The main job. First the host-setup / XPU-trigger pipeline: one process posts 64 bucketed sends
# to a peer process in advance, each armed on an XPU trigger; the XPU (a GPU kernel where CUDA
# is usable, otherwise a CPU thread) computes each bucket and rings its doorbell, which starts
# its send; the peer checks every byte. Then a ping-pong between two processes over the default
# shm provider, at a small,
# a medium and a large size: a short run with every byte checked (-c), then a timed one. The
# same flags drive libfabric's fi_pingpong, so `scripts/bench.sh` can put the two side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -q --example pingpong --example xpu_pipeline --example deferred_allreduce \
    --example moe_dispatch
echo "XPU-triggered pipeline: host posts, the XPU rings each bucket's send as soon as it is computed"
# The CPU XPU, whatever the machine has: each round also runs the ordinary way beside it, with
# the XPU's work per bucket calibrated at start-up to take as long as a bucket's transfer.
target/release/examples/xpu_pipeline --xpu cpu
echo
echo "Mixture-of-experts dispatch across 4 processes: each XPU routes its tokens at run time and"
echo "posts them itself (the FI_XPU device API), beside the host posting them after it synchronizes"
target/release/examples/moe_dispatch --ranks 4
echo
pp=target/release/examples/pingpong
port=$((40000 + RANDOM % 20000))
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
run() { # size iterations [extra flags]
    local size=$1 iters=$2
    shift 2
    "$pp" -p shm -e rdm -I "$iters" -S "$size" -B "$port" "$@" >/dev/null &
    local server=$!
    "$pp" -p shm -e rdm -I "$iters" -S "$size" -P "$port" "$@" 127.0.0.1 | tail -n 1
    wait "$server"
    port=$((port + 1))
}
echo "shm ping-pong between two processes (client side; usec/xfer is half a round trip)"
echo "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec"
for size in 8 65536 4194304; do
    iters=10000
    [ "$size" -ge 1048576 ] && iters=500
    run "$size" 100 -c >/dev/null   # every byte checked first
    run "$size" "$iters"
done
echo
echo "deferred-work allreduce across 4 processes (every step triggered by a counter, no host code after posting)"
target/release/examples/deferred_allreduce 65536 | tail -n 1
