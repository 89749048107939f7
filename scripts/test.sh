#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the C layout check, the CLI, the multi-process
# shm tests, the verbs tests in a Soft-RoCE VM, and the documentation's examples. Hardware
# tests (GPU) and the VM (where it cannot boot) skip themselves with a printed reason.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The examples as programs too: tests/examples_run.rs runs the ones that check themselves.
cargo build --workspace --examples -j2
cargo test --workspace --all-targets -j2 "$@"
# The conformance suite, the cross-process semantic tests (tagged matching, completion
# machinery and levels, atomics, RMA), the device-memory tests and the progress thread's
# sleep on several endpoints again over tcp (the workspace run above covered the default,
# shm): the same two-process tests, provider chosen by XFABRIC_TEST_PROVIDER, which the
# children inherit.
XFABRIC_TEST_PROVIDER=tcp cargo test -j2 --test conformance --test tagged --test cq \
    --test completion --test atomic --test rma --test wait_fd --test hmem --test hmem_rma \
    --test hmem_trigger --test hmem_ze --test xpu_device --test progress_thread "$@"
# shm_recv's FI_SOURCE / FI_SOURCE_ERR tests are provider-neutral too (its others rely on
# shm's cross-memory attach pulling a rendezvous without the sender's progress).
XFABRIC_TEST_PROVIDER=tcp cargo test -j2 --test shm_recv source_ "$@"
# And over verbs, inside the Soft-RoCE VM (one boot; skipped with the reason where it cannot
# run). tests/verbs_vm.rs, in the workspace run above, booted the VM for the verbs-only tests.
scripts/test-verbs-vm.sh
# Without the default features (`cuda`, `ze`): everything still builds, and the crates that hold
# those features answer "built without ... support" (cheap: no cudarc, few crates rebuilt).
cargo check -p xfabric --no-default-features --all-targets -j2
cargo test -p xfabric-hmem -p xfabric-kernels --no-default-features -j2 "$@"
# --all-targets leaves out documentation tests; the crate's first program is one.
exec cargo test --workspace --doc -j2 "$@"
