#!/usr/bin/env bash
# Runs every test of the project: unit tests, the store conformance suite on
# both backends, the Lambda-edge tests and the end-to-end tests over HTTP
# against the local gateway on the embedded store and on DynamoDB/SQS/S3
# (pinned moto servers on 127.0.0.1, one per core, started and stopped here).
#
# Before the tests it lints template.yaml with cfn-lint and `sam validate`,
# and the optional edge stack infra/edge.yaml with cfn-lint.
#
# Needs a Rust toolchain and python3 (with venv); installs the rest itself
# into $DHUKUTI_VENV (default: target/test-venv). Extra arguments go to
# `cargo test` (e.g. `bash infra/test.sh -p dhukuti-shared store`).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${DHUKUTI_VENV:-target/test-venv}"
mkdir -p target
if [ ! -x "$venv/bin/moto_server" ] || ! cmp -s infra/requirements-test.txt "$venv/.requirements"; then
  echo "== installing test tools into $venv"
  python3 -m venv "$venv"
  # --no-compile: Python writes the bytecode of what the tests import when
  # they first import it; compiling every module up front (sympy, botocore,
  # ...) would add about 150 MB to the target dir for modules never run.
  "$venv/bin/pip" install --quiet --no-compile --disable-pip-version-check -r infra/requirements-test.txt
  cp infra/requirements-test.txt "$venv/.requirements"
fi

echo "== template.yaml and infra/edge.yaml: cfn-lint; template.yaml: sam validate --lint (offline)"
"$venv/bin/cfn-lint" template.yaml infra/edge.yaml
SAM_CLI_TELEMETRY=0 "$venv/bin/sam" validate --lint --region ap-south-1 --template-file template.yaml

# One moto server per core (DHUKUTI_MOTO_SERVERS to choose): each serves
# its requests one at a time (infra/moto_server.py), so one server was the
# suite's bottleneck. Tests take the servers in turn and keep theirs
# (shared::queue::testkit::aws_endpoint).
servers="${DHUKUTI_MOTO_SERVERS:-$(nproc 2>/dev/null || echo 2)}"
endpoints=()
moto_pids=()
trap 'for p in "${moto_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT
for i in $(seq 1 "$servers"); do
  port=$("$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$venv/bin/python" infra/moto_server.py 127.0.0.1 "$port" > "target/moto-$i.log" 2>&1 &
  moto_pids+=("$!")
  for _ in $(seq 1 100); do
    if "$venv/bin/python" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/moto-api/')" 2>/dev/null; then
      break
    fi
    kill -0 "${moto_pids[-1]}" 2>/dev/null || { echo "moto failed to start:"; cat "target/moto-$i.log"; exit 1; }
    sleep 0.2
  done
  endpoints+=("http://127.0.0.1:$port")
done
echo "== moto $("$venv/bin/pip" show moto 2>/dev/null | sed -n 's/^Version: //p') on ${endpoints[*]} (pids ${moto_pids[*]})"

# The AWS-backed tests use these endpoints with dummy credentials; with
# DHUKUTI_REQUIRE_AWS=1 they fail instead of skipping when none is set.
DHUKUTI_TEST_AWS_ENDPOINT=$(IFS=,; echo "${endpoints[*]}")
export DHUKUTI_TEST_AWS_ENDPOINT
export DHUKUTI_REQUIRE_AWS=1
# tests/e2e/contract.rs runs the official Python SDK with this interpreter.
export DHUKUTI_TEST_PYTHON="$PWD/$venv/bin/python"
case "$venv" in /*) DHUKUTI_TEST_PYTHON="$venv/bin/python" ;; esac
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=ap-south-1
unset AWS_PROFILE AWS_SESSION_TOKEN

# The browser test (tests/e2e/browser.rs) drives Debian's Chromium through
# chromedriver (package chromium-driver). Installed here when missing (CI:
# Debian, root, apt reachable); DHUKUTI_CHROMIUM set makes the test fail,
# never skip, when the browser does not start.
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  # A fresh machine may have no package lists, or stale ones: update once.
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" ||
    { $sudo apt-get update && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"; }
}
need=()
[ -n "${DHUKUTI_CHROMIUM:-}" ] || command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ -n "${DHUKUTI_CHROMEDRIVER:-}" ] || command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# The invoice PDF tests (shared/src/pdf.rs) read the PDFs back with poppler's
# pdftotext/pdfinfo/pdftoppm; they fail, never skip, without them.
[ -n "${DHUKUTI_PDFTOTEXT:-}" ] || command -v pdftotext >/dev/null 2>&1 || need+=(poppler-utils)
# The webhook receivers in docs/webhooks.md run under python3, node and
# php (tests/e2e/webhooks.rs): the docs cannot rot.
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v php >/dev/null 2>&1 || need+=(php-cli)
if [ "${#need[@]}" -gt 0 ]; then
  echo "== installing ${need[*]} (apt)"
  apt_install "${need[@]}"
fi
export DHUKUTI_CHROMIUM="${DHUKUTI_CHROMIUM:-$(command -v chromium)}"
export DHUKUTI_CHROMEDRIVER="${DHUKUTI_CHROMEDRIVER:-$(command -v chromedriver)}"
export DHUKUTI_PDFTOTEXT="${DHUKUTI_PDFTOTEXT:-$(command -v pdftotext)}"
for b in "$DHUKUTI_CHROMIUM" "$DHUKUTI_CHROMEDRIVER"; do
  [ -x "$b" ] || { echo "browser test: '$b' is not an executable"; exit 1; }
done
[ -x "$DHUKUTI_PDFTOTEXT" ] || { echo "pdf tests: '$DHUKUTI_PDFTOTEXT' is not an executable"; exit 1; }
echo "== browser: $("$DHUKUTI_CHROMIUM" --version 2>/dev/null) with $("$DHUKUTI_CHROMEDRIVER" --version | cut -d' ' -f1-2)"

status=0
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee target/test-output.log || status=$?

# One closing line over every test binary (cargo prints one per binary).
awk '/^test result:/ {
       for (i = 1; i <= NF; i++) {
         if ($(i+1) ~ /^passed/) p += $i
         if ($(i+1) ~ /^failed/) f += $i
         if ($(i+1) ~ /^ignored/) s += $i
       }
     }
     END { printf "Summary: %d passed, %d failed, %d skipped\n", p, f, s }' target/test-output.log
exit "$status"
