#!/usr/bin/env bash
# The conformance suite over the verbs provider, inside the Soft-RoCE VM (scripts/rxe-vm.sh):
# one boot running the prebuilt test binary with XFABRIC_TEST_PROVIDER=verbs. The verbs-only
# tests (tests/verbs_vm.rs) boot their own VM from `cargo test`. Skips, saying why, where the
# VM cannot run (no qemu, no kernel with rdma_rxe: scripts/setup.sh installs them on Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! why=$(scripts/rxe-vm.sh --check); then
    echo "test-verbs-vm: skipped: $why" >&2
    exit 0
fi
exe=$(cargo test -j2 --test conformance --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
[ -x "$exe" ] || { echo "test-verbs-vm: no conformance test binary" >&2; exit 1; }
start=$(date +%s)
XFABRIC_TEST_PROVIDER=verbs scripts/rxe-vm.sh --timeout 500 -- "$exe" --test-threads=2
echo "test-verbs-vm: conformance over verbs in the VM: $(($(date +%s) - start)) s" >&2
