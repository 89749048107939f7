#!/usr/bin/env bash
# The main job: a ping-pong between two processes over the default shm provider, at a small,
# a medium and a large size, with data checked (-c). The same flags drive libfabric's
# fi_pingpong, so `scripts/bench.sh` can put the two side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release -q --example pingpong
pp=target/release/examples/pingpong
port=$((40000 + RANDOM % 20000))
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
for size in 8 65536 4194304; do
    iters=10000
    [ "$size" -ge 1048576 ] && iters=200
    echo "== shm ping-pong, $size bytes, $iters iterations (client side) =="
    "$pp" -p shm -e rdm -I "$iters" -S "$size" -c -B "$port" >/dev/null &
    server=$!
    "$pp" -p shm -e rdm -I "$iters" -S "$size" -c -P "$port" 127.0.0.1
    wait "$server"
    port=$((port + 1))
done
