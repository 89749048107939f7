#!/usr/bin/env bash
# Side-by-side ping-pong: libfabric's fi_pingpong and xfabric's examples/pingpong, same options,
# alternating run by run (libfabric, ours, libfabric, ours, ...) so that the machine's drift
# hits both alike. Prints each size's medians and ratios as it goes, then a final table.
#
#   scripts/bench.sh                       # 3 rounds, sizes 8 B .. 4 MiB
#   ROUNDS=1 SIZES="8 65536" scripts/bench.sh
#
# Environment:
#   ROUNDS     runs of each implementation per size (3)
#   ITERS      iterations for sizes up to 64 KiB (10000); larger sizes scale down to keep the
#              bytes per run constant, never below MIN_ITERS (200)
#   SIZES      transfer sizes in bytes (8 64 256 1024 4096 16384 65536 262144 524288 1048576
#              4194304)
#   PROVIDER   -p for both (shm)
#   PORT_BASE  first TCP control port; each run takes the next free one (47700)
#   RUN_TIMEOUT  seconds before a hung run is killed (120)
#   FI_PINGPONG  the libfabric binary (fi_pingpong from PATH)
#
# Ratios are ours/libfabric: below 1 is better for usec/xfer, above 1 is better for MB/sec.

set -u -o pipefail

ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-10000}
MIN_ITERS=${MIN_ITERS:-200}
SIZES=${SIZES:-"8 64 256 1024 4096 16384 65536 262144 524288 1048576 4194304"}
PROVIDER=${PROVIDER:-shm}
PORT_BASE=${PORT_BASE:-47700}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
FI_PINGPONG=${FI_PINGPONG:-fi_pingpong}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OURS=$TARGET_DIR/release/examples/pingpong
WORK=$(mktemp -d "${TMPDIR:-/tmp}/xfabric-bench.XXXXXX")

die() {
    echo "bench: $*" >&2
    exit 1
}

for v in ROUNDS ITERS MIN_ITERS PORT_BASE RUN_TIMEOUT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
for s in $SIZES; do
    [[ $s =~ ^[0-9]+$ ]] || die "SIZES must be byte counts (got '$s')"
done

# The server and client this script has running (one pair at a time), so none outlives it:
# killed by pid, never by name.
RUNNING=()
cleanup() {
    local pid
    for pid in "${RUNNING[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${RUNNING[@]}"; do
        wait "$pid" 2>/dev/null
    done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

have_libfabric=1
if ! command -v "$FI_PINGPONG" >/dev/null 2>&1; then
    have_libfabric=0
    echo "bench: libfabric's $FI_PINGPONG is missing (apt-get install libfabric-bin); running only xfabric" >&2
fi

echo "bench: building examples/pingpong (release)" >&2
(cd "$ROOT" && cargo build --release --example pingpong) >&2 || die "cargo build failed"
[[ -x $OURS ]] || die "no binary at $OURS (is CARGO_TARGET_DIR set as for the build?)"

# True when something listens on TCP port $1 (IPv4 or IPv6), read from /proc so no tool is
# needed.
listening() {
    local hex
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" 'FNR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p { f = 1 }
        END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

next_port=$PORT_BASE
take_port() {
    while listening "$next_port"; do
        next_port=$((next_port + 1))
    done
    port=$next_port
    next_port=$((next_port + 1))
    ((next_port > 65000)) && next_port=$PORT_BASE
}

iters_for() {
    local size=$1 n=$ITERS
    if ((size > 65536)); then
        n=$((ITERS * 65536 / size))
        ((n < MIN_ITERS)) && n=$MIN_ITERS
    fi
    echo "$n"
}

# run_pair IMPL SIZE ITERS: runs one server+client pair; sets usec and mbps from the client's
# result row, or returns 1 with the logs on stderr.
run_pair() {
    local impl=$1 size=$2 iters=$3 bin spid rc row
    case $impl in
        libfabric) bin=$FI_PINGPONG ;;
        ours) bin=$OURS ;;
    esac
    take_port
    local args=(-p "$PROVIDER" -e rdm -I "$iters" -S "$size")
    timeout "$RUN_TIMEOUT" "$bin" "${args[@]}" -B "$port" >"$WORK/server" 2>&1 &
    spid=$!
    RUNNING+=("$spid")
    # fi_pingpong's client does not retry, so wait for the server to listen.
    local tries=0
    until listening "$port"; do
        tries=$((tries + 1))
        if ((tries > 500)) || ! kill -0 "$spid" 2>/dev/null; then
            echo "bench: $impl server on port $port did not start:" >&2
            cat "$WORK/server" >&2
            kill "$spid" 2>/dev/null
            wait "$spid" 2>/dev/null
            return 1
        fi
        sleep 0.01
    done
    # In the background and waited for, so a signal to this script is handled at once.
    timeout "$RUN_TIMEOUT" "$bin" "${args[@]}" -P "$port" localhost >"$WORK/client" 2>&1 &
    local cpid=$!
    RUNNING+=("$cpid")
    wait "$cpid"
    rc=$?
    # A failed client leaves its server waiting: do not wait out RUN_TIMEOUT for it.
    ((rc != 0)) && kill "$spid" 2>/dev/null
    wait "$spid"
    local src=$?
    RUNNING=()
    row=$(awk 'NF == 8 && $3 ~ /^=/ { r = $0 } END { print r }' "$WORK/client")
    if ((rc != 0 || src != 0)) || [[ -z $row ]]; then
        echo "bench: $impl -S $size -I $iters failed (client rc $rc, server rc $src):" >&2
        sed 's/^/  client: /' "$WORK/client" >&2
        sed 's/^/  server: /' "$WORK/server" >&2
        return 1
    fi
    read -r _ _ _ _ _ mbps usec _ <<<"$row"
    return 0
}

# median of the arguments ("-" when there are none).
median() {
    if (($# == 0)); then
        echo "-"
        return
    fi
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
        END { if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2;
              printf "%.2f\n", m }'
}

ratio() {
    if [[ $1 == - || $2 == - ]]; then
        echo "-"
    else
        awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f\n", a / b; else print "-" }'
    fi
}

human() {
    local n=$1
    if ((n >= 1048576 && n % 1048576 == 0)); then
        echo "$((n / 1048576))m"
    elif ((n >= 1024 && n % 1024 == 0)); then
        echo "$((n / 1024))k"
    else
        echo "$n"
    fi
}

impls=(ours)
((have_libfabric)) && impls=(libfabric ours)

printf -v header '%-6s %7s | %10s %10s %6s | %10s %10s %6s' \
    bytes iters "lf usec" "our usec" ratio "lf MB/s" "our MB/s" ratio
table=()
failures=0
echo "bench: provider $PROVIDER, $ROUNDS round(s), sizes: $SIZES" >&2
for size in $SIZES; do
    iters=$(iters_for "$size")
    lf_usec=() lf_mbps=() our_usec=() our_mbps=()
    for ((r = 1; r <= ROUNDS; r++)); do
        for impl in "${impls[@]}"; do
            if run_pair "$impl" "$size" "$iters"; then
                if [[ $impl == libfabric ]]; then
                    lf_usec+=("$usec") lf_mbps+=("$mbps")
                else
                    our_usec+=("$usec") our_mbps+=("$mbps")
                fi
                printf 'bench: %-6s round %d %-9s usec/xfer %9s  MB/sec %10s\n' \
                    "$(human "$size")" "$r" "$impl" "$usec" "$mbps" >&2
            else
                failures=$((failures + 1))
            fi
        done
    done
    lu=$(median "${lf_usec[@]}") ou=$(median "${our_usec[@]}")
    lm=$(median "${lf_mbps[@]}") om=$(median "${our_mbps[@]}")
    printf -v line '%-6s %7s | %10s %10s %6s | %10s %10s %6s' "$(human "$size")" "$iters" \
        "$lu" "$ou" "$(ratio "$ou" "$lu")" "$lm" "$om" "$(ratio "$om" "$lm")"
    echo "$header"
    echo "$line"
    echo
    table+=("$line")
done

echo "Medians of $ROUNDS round(s); ratio = ours/libfabric (usec: lower is better, MB/s: higher is better)"
((have_libfabric)) || echo "(libfabric's fi_pingpong is missing: its columns are empty)"
echo "$header"
printf '%s\n' "${table[@]}"
if ((failures > 0)); then
    echo "bench: $failures run(s) failed (see above)" >&2
    exit 1
fi
