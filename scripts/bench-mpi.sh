#!/usr/bin/env bash
# Open MPI ping-pong (capi/tests/c/mpi_pingpong.c, built with mpicc) over btl ofi with the shm
# provider: the same binary on xfabric's libfabric.so.1 (capi/, through LD_LIBRARY_PATH) and on
# Debian's libfabric (without it), alternating run by run (xfabric, libfabric, xfabric, ...) so
# the machine's drift hits both alike. Prints each run's one-way latencies, then per size the
# min/median/max of each and the xfabric/libfabric ratio of the medians, and the per-round
# ratios. The mpirun line is capi/tests/mpi.rs's:
#
#   mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,ofi \
#          --mca btl_ofi_mode 2 --mca btl_ofi_provider_include shm -x FI_PROVIDER=shm ...
#
# The whole run holds /tmp/xf-bench.lock (flock), the lock the other benchmarks take, so timing
# runs do not overlap; every run is bounded by RUN_TIMEOUT and a signal kills what is running.
#
#   scripts/bench-mpi.sh
#   ROUNDS=3 SIZES="8 65536" ITERS=50 scripts/bench-mpi.sh
#
# Environment:
#   ROUNDS       runs of each library (5)
#   ITERS        exchanges per size in a run, after one warm-up (200)
#   SIZES        message sizes in bytes, at most 4 MiB (8 4096 65536 1048576 4194304)
#   RUN_TIMEOUT  seconds before a hung mpirun is killed (120)
#   BENCH_LOCK   the lock file (/tmp/xf-bench.lock)

set -u -o pipefail

ROUNDS=${ROUNDS:-5}
ITERS=${ITERS:-200}
SIZES=${SIZES:-"8 4096 65536 1048576 4194304"}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
BENCH_LOCK=${BENCH_LOCK:-/tmp/xf-bench.lock}

die() {
    echo "bench-mpi: $*" >&2
    exit 1
}

# Take the lock for the whole run (once: the re-run holds it through flock's fd).
if [[ -z ${XF_BENCH_MPI_LOCKED:-} ]]; then
    command -v flock >/dev/null || die "flock is missing (util-linux)"
    echo "bench-mpi: waiting for $BENCH_LOCK" >&2
    XF_BENCH_MPI_LOCKED=1 exec flock "$BENCH_LOCK" "$0" "$@"
fi

for tool in mpicc mpirun; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install libopenmpi-dev openmpi-bin)"
done

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
CAPI_DIR=$TARGET_DIR/release/capi-libdir
WORK=$(mktemp -d "${TMPDIR:-/tmp}/xfabric-bench-mpi.XXXXXX")
RUNNING=
cleanup() {
    [[ -n $RUNNING ]] && kill -- "$RUNNING" 2>/dev/null && wait "$RUNNING" 2>/dev/null
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "bench-mpi: building libfabric.so.1 (capi, release)" >&2
(cd "$ROOT" && cargo build --release -p xfabric-capi --lib) >&2 || die "cargo build of capi failed"
mkdir -p "$CAPI_DIR"
ln -sf "$TARGET_DIR/release/libfabric.so" "$CAPI_DIR/libfabric.so.1"
mpicc -O2 -o "$WORK/mpi_pingpong" "$ROOT/capi/tests/c/mpi_pingpong.c" || die "mpicc failed"

# run_mpi IMPL: one mpirun of the ping-pong; its "size usec" rows in $WORK/out, or 1.
run_mpi() {
    local lib=
    [[ $1 == xfabric ]] && lib=$CAPI_DIR
    # shellcheck disable=SC2086 # SIZES is a list
    LD_LIBRARY_PATH=$lib FI_PROVIDER=shm timeout -k 5 "$RUN_TIMEOUT" mpirun --allow-run-as-root \
        --oversubscribe -np 2 --mca pml ob1 --mca btl self,ofi --mca btl_ofi_mode 2 \
        --mca btl_ofi_provider_include shm -x FI_PROVIDER=shm -x LD_LIBRARY_PATH \
        "$WORK/mpi_pingpong" "$ITERS" $SIZES >"$WORK/out" 2>"$WORK/err" &
    RUNNING=$!
    wait "$RUNNING"
    local rc=$?
    RUNNING=
    if ((rc != 0)) || ! grep -q '^pingpong ok' "$WORK/out"; then
        echo "bench-mpi: $1 run failed (rc $rc):" >&2
        sed 's/^/  /' "$WORK/out" "$WORK/err" >&2
        return 1
    fi
}

median() {
    printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) { print "-"; exit }
              if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2
              printf "%.2f\n", m }'
}

declare -A res # res[impl,size]="usec usec ..."; pr[size]="ratio ..." for rounds where both ran
declare -A pr
echo "bench-mpi: $ROUNDS round(s), $ITERS exchanges per size, sizes: $SIZES; $(uptime)" >&2
for ((r = 1; r <= ROUNDS; r++)); do
    declare -A this=()
    for impl in xfabric libfabric; do
        run_mpi "$impl" || continue
        while read -r size usec; do
            [[ $size =~ ^[0-9]+$ ]] || continue
            res[$impl,$size]+="$usec "
            this[$impl,$size]=$usec
            printf 'bench-mpi: round %d %-9s %8s B  %10s usec\n' "$r" "$impl" "$size" "$usec" >&2
        done <"$WORK/out"
    done
    for size in $SIZES; do
        if [[ -n ${this[xfabric,$size]:-} && -n ${this[libfabric,$size]:-} ]]; then
            pr[$size]+="$(awk -v a="${this[xfabric,$size]}" -v b="${this[libfabric,$size]}" \
                'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }') "
        fi
    done
    unset this
done

echo "Open MPI ping-pong, btl ofi over shm, one-way usec, $ROUNDS alternating round(s); $(uptime)"
printf '%8s | %-28s | %-28s | %6s | %s\n' bytes "xfabric min/med/max" "libfabric min/med/max" \
    ratio "per-round ratios (xfabric/libfabric)"
for size in $SIZES; do
    # shellcheck disable=SC2086 # lists of figures
    read -r xmin xmax <<<"$(printf '%s\n' ${res[xfabric,$size]:-} | sort -g | awk 'NR == 1 { a = $1 } { b = $1 } END { print a, b }')"
    # shellcheck disable=SC2086
    read -r lmin lmax <<<"$(printf '%s\n' ${res[libfabric,$size]:-} | sort -g | awk 'NR == 1 { a = $1 } { b = $1 } END { print a, b }')"
    # shellcheck disable=SC2086
    xmed=$(median ${res[xfabric,$size]:-})
    # shellcheck disable=SC2086
    lmed=$(median ${res[libfabric,$size]:-})
    ratio=$(awk -v a="$xmed" -v b="$lmed" 'BEGIN { if (a != "-" && b > 0) printf "%.2f", a / b; else printf "-" }')
    printf '%8s | %-28s | %-28s | %6s | %s\n' "$size" "${xmin:--}/$xmed/${xmax:--}" \
        "${lmin:--}/$lmed/${lmax:--}" "$ratio" "${pr[$size]:-}"
done
