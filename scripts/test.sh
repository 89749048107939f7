#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the C layout check, the CLI, and the
# multi-process shm tests. Hardware tests (GPU) skip themselves with a printed reason.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo test --workspace --all-targets -j2 "$@"
