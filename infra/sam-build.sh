#!/usr/bin/env bash
# `sam build` of template.yaml, as a deploy runs it: each function built by
# cargo-lambda from its own crate's directory, alone with its own features
# of `shared`, for arm64 (Linux, zig as the linker), copied where
# `sam deploy` takes it. CI runs it (.ci/run) after the tests.
#
# Debug by default (SAM_BUILD_MODE=debug): the same crates, features,
# target and layout as the release build a deploy makes, at a fraction of
# its time (release is fat LTO, one codegen unit: BENCHMARKS.md §4). Set
# SAM_BUILD_MODE=release for the deployable build.
#
# Needs a Rust toolchain with rustup (the arm64 target is added here) and
# python3; installs cargo-lambda (with zig) and the SAM CLI into
# $DHUKUTI_VENV (default: target/test-venv; infra/requirements-test.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${DHUKUTI_VENV:-target/test-venv}"
case "$venv" in /*) ;; *) venv="$PWD/$venv" ;; esac
if [ ! -x "$venv/bin/cargo-lambda" ] || ! cmp -s infra/requirements-test.txt "$venv/.requirements"; then
  echo "== installing test tools into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-compile --disable-pip-version-check -r infra/requirements-test.txt
  cp infra/requirements-test.txt "$venv/.requirements"
fi
if command -v rustup >/dev/null 2>&1; then
  rustup target add aarch64-unknown-linux-gnu >/dev/null
fi

target="${CARGO_TARGET_DIR:-$PWD/target}"
build_dir="$target/sam-build"
mode="${SAM_BUILD_MODE:-debug}"
echo "== sam build ($mode, arm64) into $build_dir"
start=$(date +%s)
# `cargo lambda` is found on PATH by cargo; sam finds `cargo` there too.
PATH="$venv/bin:$PATH" SAM_CLI_TELEMETRY=0 SAM_BUILD_MODE="$mode" \
  "$venv/bin/sam" build --beta-features --template-file template.yaml \
  --build-dir "$build_dir"

# Every function of the template has its bootstrap, an arm64 Linux
# executable (sam would deploy an empty or a host binary otherwise).
functions=$(grep -c '^    Type: AWS::Serverless::Function' template.yaml)
built=0
for bootstrap in "$build_dir"/*/bootstrap; do
  [ -f "$bootstrap" ] || continue
  head -c 20 "$bootstrap" | od -An -tx1 | tr -d ' \n' | grep -q '^7f454c46020101.\{22\}b700' ||
    { echo "not an arm64 ELF executable: $bootstrap"; exit 1; }
  built=$((built + 1))
done
echo "== sam build: $built of $functions functions built in $(( $(date +%s) - start )) s"
[ "$built" -eq "$functions" ] || { echo "sam build: expected $functions bootstraps, found $built"; exit 1; }
# The binaries are only proof: keep the disk of a CI machine.
rm -rf "$build_dir"
