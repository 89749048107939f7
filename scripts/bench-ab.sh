#!/usr/bin/env bash
# scripts/bench-ab.sh OLD NEW - two builds of examples/pingpong against each other and against
# Debian's fi_pingpong, alternating run by run (libfabric, OLD, NEW, libfabric, ...) so that the
# machine's drift hits all three alike. The gate for a change that must not make a provider
# slower: build OLD from the base commit, NEW from the change, e.g.
#
#   git stash; cargo build --release --example pingpong; cp target/release/examples/pingpong /tmp/pp-old
#   git stash pop; cargo build --release --example pingpong
#   scripts/bench-ab.sh /tmp/pp-old target/release/examples/pingpong
#
# Prints each run as "variant size usec", then per size min / median / max of usec per
# one-way transfer (half a round trip, fi_pingpong's usec/xfer) and the ratios of medians.
#
# Environment:
#   ROUNDS    runs of each per size (10)
#   SIZES     transfer sizes in bytes (8 4096 65536 1048576)
#   PROVIDER  -p for all three (shm)
#   PORT_BASE first control port; each run takes the next (51000)
#   FI_PINGPONG  the libfabric binary (fi_pingpong from PATH; "none" leaves it out)
#   PIN       0 runs them unpinned (1: servers on CPU 0, clients on CPU 1, as scripts/bench.sh)
#
# usec is derived from MB/sec where that figure has more digits (as scripts/bench.sh does): at
# 8 B over shm the printed usec's last digit is 4%.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
old=$1
new=$2
rounds=${ROUNDS:-10}
sizes=${SIZES:-8 4096 65536 1048576}
prov=${PROVIDER:-shm}
port=${PORT_BASE:-51000}
lf=${FI_PINGPONG:-fi_pingpong}
pin=${PIN:-1}
srv_pin=() cli_pin=()
if [[ $pin == 1 ]]; then
    srv_pin=(taskset -c 0) cli_pin=(taskset -c 1)
elif [[ $pin != 0 ]]; then
    echo "bench-ab: PIN must be 0 or 1 (got '$pin')" >&2
    exit 2
fi
variants=(old new)
if [[ $lf != none ]]; then
    command -v "$lf" >/dev/null || { echo "bench-ab: $lf not found (FI_PINGPONG=none to leave it out)" >&2; exit 1; }
    variants=(lf old new)
fi

# Iterations per size: about the same bytes per run, at least 200.
iters() {
    local s=$1
    if ((s <= 4096)); then echo 20000; else
        local n=$((327680000 / s))
        echo $((n < 200 ? 200 : n))
    fi
}

# One ping-pong: server in the background, client in front; prints the client's usec/xfer.
run() {
    local bin=$1 size=$2 it=$3 extra=()
    [[ $bin == "$lf" ]] && extra=(-e rdm)
    port=$((port + 1))
    timeout 120 "${srv_pin[@]}" "$bin" -p "$prov" "${extra[@]}" -I "$it" -S "$size" -B "$port" \
        >/dev/null 2>&1 &
    local srv=$!
    sleep 0.2
    timeout 120 "${cli_pin[@]}" "$bin" -p "$prov" "${extra[@]}" -I "$it" -S "$size" -P "$port" \
        127.0.0.1 2>&1 |
        awk -v s="$size" '/^[0-9]/ { u = $7; m = $6 }
            END { if (u == "") print "fail"; else if (m + 0 > u + 0) printf "%.4f\n", s / m; else print u }'
    wait "$srv" || true
}

out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
    for s in $sizes; do
        it=$(iters "$s")
        for v in "${variants[@]}"; do
            case $v in lf) b=$lf ;; old) b=$old ;; new) b=$new ;; esac
            line="$v $s $(run "$b" "$s" "$it")"
            echo "$line" | tee -a "$out"
        done
    done
done

echo
echo "usec per one-way transfer, min / median / max of $rounds ($prov)"
python3 - "$out" "${variants[*]}" "$sizes" <<'EOF'
import sys
from collections import defaultdict

path, variants, sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
runs = defaultdict(list)
for line in open(path):
    v, s, u = line.split()
    if u != "fail":
        runs[(v, s)].append(float(u))

def med(x):
    x = sorted(x)
    return x[len(x) // 2]

for s in sizes:
    cells = []
    for v in variants:
        x = sorted(runs[(v, s)])
        cells.append(f"{v} {x[0]:.2f}/{med(x):.2f}/{x[-1]:.2f}" if x else f"{v} -")
    ratios = []
    if runs[("old", s)] and runs[("new", s)]:
        ratios.append(f"new/old {med(runs[('new', s)]) / med(runs[('old', s)]):.2f}")
    if runs[("lf", s)] and runs[("old", s)]:
        ratios.append(f"old/lf {med(runs[('old', s)]) / med(runs[('lf', s)]):.2f}")
    print(f"{s:>8} B  " + " | ".join(cells) + "  " + ", ".join(ratios))
EOF
