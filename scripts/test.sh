#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the C layout check, the CLI, and the
# multi-process shm tests. Hardware tests (GPU) skip themselves with a printed reason.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The examples as programs too: tests/examples_run.rs runs the ones that check themselves.
cargo build --workspace --examples -j2
exec cargo test --workspace --all-targets -j2 "$@"
