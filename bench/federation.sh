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
# Latency (bench/src/federation/latency.rs): for each pair sender:receiver of
# seqline:seqline, seqline:synapse, synapse:seqline and synapse:synapse, fresh
# servers, a room of the sender's user joined by the receiver's; the time from
# a message's (and, separately, a typing notice's) request on the sender until
# it is in the receiver's user's waiting /sync long-poll; p50/p95/max of
# --samples each (after a warm-up), and seqline->seqline p95 beside
# Synapse->Synapse p95:
#   bench/federation.sh --mode latency                     # 50 samples of each kind per pair
#   bench/federation.sh --mode latency --latency-pairs seqline:seqline --samples 10
#
# Fan-out (bench/src/federation/fanout.rs): the server under test (seqline and
# Synapse in alternating rounds, fresh servers, presence on) hosts a room of
# its --users-per-server users joined by as many users of each of --fakes fake
# servers (500 on 20 servers by default); for --window-secs its users send a
# message a second (read by three others), type (5 every 4 s) and change
# presence (3 every 10 s) while each fake counts the /send transactions, bytes,
# PDUs and EDUs by type it receives, per minute and per destination:
#   bench/federation.sh --mode fanout                      # 60 s windows, 3 rounds
#   bench/federation.sh --mode fanout --rounds 1 --window-secs 30
#
# Flags: `seqline-fed-bench --help`. seqline is built in release into
# $CARGO_TARGET_DIR (default ~/.cache/seqline/target) and both binaries are
# run from copies in --out/bin; Synapse runs from the pinned venv of
# complement-tests/clients/synapse/setup.sh (built once). Results (table,
# JSON, the servers' logs) go to --out (default
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
cargo build --release --bin seqline -p seqline --bin seqline-fed-bench -p seqline-bench --quiet
# Run copies: another checkout sharing $CARGO_TARGET_DIR may rebuild the binaries during the run.
mkdir -p "$OUT/bin"
cp "$CARGO_TARGET_DIR/release/seqline" "$CARGO_TARGET_DIR/release/seqline-fed-bench" "$OUT/bin/"
echo "== Synapse venv (complement-tests/clients/synapse/setup.sh)"
PYTHON="$(bash complement-tests/clients/synapse/setup.sh | tail -n 1)"
echo "Synapse $("$PYTHON" -c 'import synapse; print(synapse.__version__)') on $("$PYTHON" --version)"
echo "seqline $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src migrations || echo '+changes')"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
"$OUT/bin/seqline-fed-bench" \
  --seqline-bin "$OUT/bin/seqline" --synapse-python "$PYTHON" \
  --out "$OUT" --json-out "$OUT/results.json" "${ARGS[@]}" | tee "$OUT/results.txt" || status=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "results in $OUT"
exit "${status:-0}"
