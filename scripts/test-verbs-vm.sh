#!/usr/bin/env bash
# The conformance suite (twice: core's keys, then the NIC's), the cross-process semantic tests
# (tagged matching, completion machinery and levels, atomics, RMA), the device-memory tests and
# the device API's (CPU XPUs posting through exported endpoints) and a progress thread's sleep
# on several endpoints (tests/progress_thread.rs) over the verbs provider, inside
# the Soft-RoCE VM (scripts/rxe-vm.sh): one boot running the prebuilt test binaries with
# XFABRIC_TEST_PROVIDER=verbs, one after the other, each one's time printed. The device API's
# four XPU threads send 8,000 descriptors here instead of 100,000 (XFABRIC_XPU_TEST_N): the
# emulated VM moves a few hundred a second, over shm as over verbs. The verbs-only tests
# (tests/verbs_vm.rs) boot their own VM from `cargo test`. Skips, saying why, where the VM
# cannot run (no qemu, no kernel with rdma_rxe: scripts/setup.sh installs them on Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! why=$(scripts/rxe-vm.sh --check); then
    echo "test-verbs-vm: skipped: $why" >&2
    exit 0
fi
tests=(conformance tagged cq completion atomic rma hmem hmem_rma hmem_trigger hmem_ze xpu_device progress_thread)
args=()
for t in "${tests[@]}"; do args+=(--test "$t"); done
# The test binaries only (cargo also lists the workspace's programs).
mapfile -t exes < <(cargo test -j2 "${args[@]}" --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\/deps\/[^"]*\)".*/\1/p')
[ "${#exes[@]}" -eq "${#tests[@]}" ] || {
    echo "test-verbs-vm: expected ${#tests[@]} test binaries, found: ${exes[*]}" >&2
    exit 1
}
# Each binary as "NAME: N s" on stderr once it passed (the VM has a shell and date).
timed() {
    printf 's=$(date +%%s) && %s --test-threads=2 && echo "test-verbs-vm: %s: $(($(date +%%s) - s)) s" >&2 && ' "$2" "$1"
}
run=""
for e in "${exes[@]}"; do
    name=$(basename "$e")
    case "${name%-*}" in
    xpu_device) run+=$(timed "${name%-*}" "XFABRIC_XPU_TEST_N=8000 $e") ;;
    *) run+=$(timed "${name%-*}" "$e") ;;
    esac
done
# The conformance suite once more with provider keys (XFABRIC_TEST_MR_MODE=nic): the keys are
# the NIC's rkeys, and RMA and atomics go through the NIC where they can (the NIC's atomics
# asked for, off by default: XFABRIC_VERBS_NATIVE_ATOMICS).
conf=$(printf '%s\n' "${exes[@]}" | grep '/conformance-')
run+=$(timed "conformance (NIC keys)" "XFABRIC_TEST_MR_MODE=nic XFABRIC_VERBS_NATIVE_ATOMICS=1 $conf")
start=$(date +%s)
XFABRIC_TEST_PROVIDER=verbs scripts/rxe-vm.sh --timeout 1800 -- sh -c "${run}true"
echo "test-verbs-vm: ${tests[*]} over verbs in the VM: $(($(date +%s) - start)) s" >&2
