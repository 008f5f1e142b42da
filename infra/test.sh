#!/usr/bin/env bash
# Runs every test of the project: unit tests, the store conformance suite,
# the Lambda-edge tests and the end-to-end tests over HTTP against the local
# gateway on a real loopback socket. Needs nothing but a Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --workspace --locked "$@"
