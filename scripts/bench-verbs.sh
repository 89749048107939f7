#!/usr/bin/env bash
# scripts/bench-verbs.sh [ROUNDS] - figures for the record, not a performance claim: latency and
# bandwidth of examples/pingpong -p verbs next to ibv_rc_pingpong (rdma-core's own RC
# ping-pong) on the same Soft-RoCE device, inside the VM (scripts/rxe-vm.sh; TCG emulation when
# there is no usable KVM). Runs alternate (ours, then theirs, per round); each size prints
# min/median/max over the rounds of usec per transfer (half a round trip) and MB/s (both
# directions' bytes, as both tools count them).
#
# Then, ours against ours: large messages as chunks (the default) and read by the receiver's
# NIC (RDMA read, XFABRIC_VERBS_PULL_MIN=65536), and RMA write/read bandwidth through the NIC
# (the default) and through the engine (XFABRIC_VERBS_NATIVE=0), alternating per round.
# SECTIONS picks which run (default "pingpong pulls rma").
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SIZES=${SIZES:-"64 4096 65536 1048576"}
BIG=${BIG:-"262144 1048576 4194304"}
SECTIONS=${SECTIONS:-"pingpong pulls rma"}

if [ -z "${XFABRIC_RXE_VM:-}" ]; then
    cargo build --release --example pingpong -j2 >&2
    exec flock /tmp/xf-bench.lock scripts/rxe-vm.sh --timeout 580 -- \
        env XFABRIC_RXE_VM=1 ROUNDS="$ROUNDS" SIZES="$SIZES" BIG="$BIG" SECTIONS="$SECTIONS" \
        "$0" "$ROUNDS"
fi

# ---- inside the VM ----
P=target/release/examples/pingpong
# Iterations of a bandwidth run: windows of 16 operations, about 64 MiB in all.
rma_iters_for() {
    if (($1 >= 4194304)); then echo 1; elif (($1 >= 1048576)); then echo 4; else echo 16; fi
}
iters_for() {
    if (($1 >= 1048576)); then echo 20; elif (($1 >= 65536)); then echo 200; else echo 1000; fi
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { printf '%s/%s/%s' "$(printf '%s\n' "$@" | sort -g | head -1)" "$(median "$@")" "$(printf '%s\n' "$@" | sort -g | tail -1)"; }

# ours SIZE ITERS [ARGS...] -> "usec mbps" (the client's line: ... MB/sec usec/xfer Mxfers/sec)
ours() {
    local size=$1 it=$2
    shift 2
    # OURS_ENV: a setting for both processes (empty: none).
    env ${OURS_ENV:-} timeout 120 "$P" -p verbs -e rdm -I "$it" -S "$size" "$@" >/tmp/pp-s.log 2>&1 &
    local s=$! out
    sleep 0.5
    out=$(env ${OURS_ENV:-} timeout 120 "$P" -p verbs -e rdm -I "$it" -S "$size" "$@" 192.0.2.1 2>&1 |
        tail -1)
    wait "$s" || true
    awk '{print $7, $6}' <<<"$out"
}

# theirs SIZE ITERS -> "usec mbps": usec/iter is a round trip (halved); Mbit/s over both directions
theirs() {
    timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -s "$1" -n "$2" >/tmp/ib-s.log 2>&1 &
    local s=$! out
    sleep 0.5
    out=$(timeout 120 ibv_rc_pingpong -d rxe0 -g 1 -s "$1" -n "$2" 192.0.2.1 2>&1)
    wait "$s" || true
    local us mbit
    us=$(awk '/usec\/iter/ {print $(NF-1)}' <<<"$out")
    mbit=$(awk '/Mbit\/sec/ {print $(NF-1)}' <<<"$out")
    awk -v u="$us" -v m="$mbit" 'BEGIN {printf "%.2f %.2f\n", u / 2, m / 8}'
}

# two A_ENV B_ENV LABEL_A LABEL_B [PINGPONG ARGS...]: the two settings alternated per round
# over $BIG, MB/s min/median/max.
two() {
    local ea=$1 eb=$2 la=$3 lb=$4
    shift 4
    printf '%-8s %6s | %-28s | %-28s\n' bytes iters "$la MB/s min/med/max" "$lb MB/s"
    for size in $BIG; do
        local it a=() b=() x
        it=$(${ITERS:-iters_for} "$size")
        for ((r = 1; r <= ROUNDS; r++)); do
            x=$(OURS_ENV=$ea ours "$size" "$it" "$@") && [ -n "$x" ] && a+=("${x#* }")
            x=$(OURS_ENV=$eb ours "$size" "$it" "$@") && [ -n "$x" ] && b+=("${x#* }")
        done
        printf '%-8s %6s | %-28s | %-28s\n' "$size" "$it" "$(spread "${a[@]}")" "$(spread "${b[@]}")"
    done
}

for section in $SECTIONS; do
    case $section in
    pingpong) ;;
    pulls)
        echo "# messages: read by the receiver's NIC vs chunks (ping-pong, MB/s)"
        two XFABRIC_VERBS_PULL_MIN=65536 XFABRIC_VERBS_PULL_MIN=0 "RDMA read" "chunks"
        continue
        ;;
    rma)
        for op in write read; do
            echo "# RMA $op bandwidth: the NIC vs the engine (window of 16)"
            ITERS=rma_iters_for two XFABRIC_VERBS_NATIVE=1 XFABRIC_VERBS_NATIVE=0 "NIC" "engine" \
                -o "$op" -W 16
        done
        continue
        ;;
    *)
        echo "bench-verbs: unknown section $section" >&2
        exit 2
        ;;
    esac
    printf '%-8s %6s | %-26s %-26s | %-26s %-26s\n' bytes iters "ours usec min/med/max" \
        "ibv_rc_pingpong usec" "ours MB/s min/med/max" "ibv_rc_pingpong MB/s"
    for size in $SIZES; do
        it=$(iters_for "$size")
        ou=() om=() iu=() im=()
        for ((r = 1; r <= ROUNDS; r++)); do
            # (no process substitution: the VM's /dev has no /dev/fd)
            x=$(ours "$size" "$it") && [ -n "$x" ] && ou+=("${x% *}") om+=("${x#* }")
            x=$(theirs "$size" "$it") && [ -n "$x" ] && iu+=("${x% *}") im+=("${x#* }")
        done
        printf '%-8s %6s | %-26s %-26s | %-26s %-26s\n' "$size" "$it" "$(spread "${ou[@]}")" \
            "$(spread "${iu[@]}")" "$(spread "${om[@]}")" "$(spread "${im[@]}")"
    done
done
