#!/usr/bin/env bash
# Runs Sandia OpenSHMEM 1.5.3's test suite (modules/tests-sos/test, `make check` in all of
# unit, shmemx, performance, apps and spec-example; 2 PEs under Open MPI, each test bounded at
# 30 s) over xfabric's libfabric.so.1 on shm and tcp, and prints the pass counts and the
# failures. SOS is built against Debian's libfabric headers, outside this repository:
#
#   scripts/sos.sh SOS_SRC      # an SOS v1.5.3 tree with modules/tests-sos filled in
#   SOS_SRC=... FABRIC_LIB=system scripts/sos.sh   # Debian's libfabric (shm, tcp;ofi_rxm)
#   SOS_PROVIDERS="tcp" scripts/sos.sh SOS_SRC     # the providers to run (SHMEM_OFI_PROVIDER)
#
# The library under test is copied for the run, so rebuilding the tree meanwhile changes
# nothing. Logs: SOS_SRC/sos-check-<lib>-<provider>.log. A full run takes tens of minutes.
# Without a source tree, mpicc or autotools, it says why and exits 0. Open MPI itself is kept
# off libfabric (pml ob1, btl self,vader), so only SOS talks to the library under test.
set -uo pipefail
cd "$(dirname "$0")/.."

src=${1:-${SOS_SRC:-}}
if [[ -z "$src" || ! -f "$src/configure.ac" || ! -f "$src/modules/tests-sos/configure.ac" ]]; then
    echo "sos: skipped: no SOS source tree given (SOS v1.5.3 with modules/tests-sos; pass it or set SOS_SRC)"
    exit 0
fi
for tool in mpicc mpirun autoreconf make; do
    if ! command -v $tool >/dev/null; then
        echo "sos: skipped: $tool is not installed (apt-get install libopenmpi-dev openmpi-bin autoconf automake libtool)"
        exit 0
    fi
done
lib=${FABRIC_LIB:-xfabric}
if [[ "$lib" == system ]]; then
    libpath=
else
    # The optimized build: several tests are timed loops that an unoptimized library (2-3
    # times slower per operation) takes past the 30 s bound on a small, busy machine.
    cargo build -q --release -j2 -p xfabric-capi || exit 1
    libpath=$(mktemp -d)
    trap 'rm -rf "$libpath"' EXIT
    cp "$PWD/target/release/libfabric.so" "$libpath/libfabric.so.1"
fi
if [[ "$lib" == system ]]; then
    providers=${SOS_PROVIDERS:-shm tcp;ofi_rxm}
else
    providers=${SOS_PROVIDERS:-shm tcp}
fi

cd "$src" || exit 1
if [[ ! -f Makefile ]]; then
    (./autogen.sh && ./configure --with-ofi=/usr --enable-pmi-mpi CC=mpicc CXX=mpicxx \
        --disable-fortran --enable-ofi-mr=basic --enable-hard-polling \
        --enable-ofi-manual-progress --enable-manual-progress --enable-memcpy) >sos-configure.log 2>&1 ||
        { echo "sos: configure failed (see $src/sos-configure.log)"; exit 1; }
fi
make -j2 >sos-make.log 2>&1 || { echo "sos: build failed (see $src/sos-make.log)"; exit 1; }

export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
launcher="timeout 30 mpirun --allow-run-as-root -np 2 -x SHMEM_OFI_PROVIDER"
[[ -n "$libpath" ]] && launcher="$launcher -x LD_LIBRARY_PATH=$libpath"
for prov in $providers; do
    log=$PWD/sos-check-$lib-${prov%%;*}.log
    start=$SECONDS
    # The suite's LOG_COMPILER is its TEST_RUNNER (oshrun by default).
    SHMEM_OFI_PROVIDER=$prov make -k check -C modules/tests-sos/test \
        TEST_RUNNER="$launcher" >"$log" 2>&1
    pass=$(grep -c '^PASS:' "$log")
    total=$(grep -cE '^(PASS|FAIL|XFAIL|XPASS|ERROR|SKIP):' "$log")
    echo "sos ($lib, $prov): $pass of $total passed in $((SECONDS - start)) s; failures:"
    grep -E '^(FAIL|ERROR):' "$log" | sed 's/^/    /'
done
