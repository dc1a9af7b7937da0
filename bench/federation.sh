#!/usr/bin/env bash
# The federation join benchmark: for each pair (resident, joiner) of
# (seqline, Synapse), (Synapse, seqline) and (Synapse A, Synapse B), starts both
# servers fresh on loopback (TLS federation listeners, self-signed
# certificates), builds on the resident a room of 500 members and 5,000 events,
# then times a remote join by a user of the joiner, 5 times, and prints a table.
#
#   bench/federation.sh [seqline-fed-bench flags...]
#   bench/federation.sh                                   # 500 members, 5,000 events, 5 joins per pair
#   bench/federation.sh --members 20 --events 100        # a quick run
#   bench/federation.sh --pairs synapse:seqline --repeats 3
#   bench/federation.sh --postgres postgres://postgres@127.0.0.1:5432   # needs psycopg2 in the venv
#
# Two more modes (bench/src/federation/pdus.rs), each with a fake federation
# server (complement-tests' FakeServer) sending or hosting, seqline and Synapse
# as the receiver in alternating rounds on fresh servers:
#   bench/federation.sh --mode inbound                     # 5,000 PDUs into a 500-member room, linear and forked, 3 rounds
#   bench/federation.sh --mode inbound --pdus 1000         # what fits in a quarter of an hour with Synapse at ~10 PDUs/s
#   bench/federation.sh --mode backfill                    # page back through a fake's room of 5,000 events, 3 rounds
#   bench/federation.sh --mode inbound,backfill --servers seqline --members 20 --pdus 300 --history 500 --rounds 1
#
# Flags: `seqline-fed-bench --help`. seqline is built in release into
# $CARGO_TARGET_DIR (default ~/.cache/seqline/target); Synapse runs from the
# pinned venv of complement-tests/clients/synapse/setup.sh (built once).
# Results (table, JSON, the servers' logs) go to --out (default
# ~/.cache/seqline/bench-results/fed-<time>). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/seqline/target}"
OUT=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
OUT="${OUT:-$HOME/.cache/seqline/bench-results/fed-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"

echo "== building seqline and seqline-fed-bench (release)"
cargo build --release --bin seqline -p seqline --quiet
cargo build --release --bin seqline-fed-bench -p seqline-bench --quiet
echo "== Synapse venv (complement-tests/clients/synapse/setup.sh)"
PYTHON="$(bash complement-tests/clients/synapse/setup.sh | tail -n 1)"
echo "Synapse $("$PYTHON" -c 'import synapse; print(synapse.__version__)') on $("$PYTHON" --version)"
echo "seqline $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src migrations || echo '+changes')"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
"$CARGO_TARGET_DIR/release/seqline-fed-bench" \
  --seqline-bin "$CARGO_TARGET_DIR/release/seqline" --synapse-python "$PYTHON" \
  --out "$OUT" --json-out "$OUT/results.json" "${ARGS[@]}" | tee "$OUT/results.txt" || status=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "results in $OUT"
exit "${status:-0}"
