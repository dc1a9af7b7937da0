#!/usr/bin/env bash
# Runs the chapter's workload (seqline-bench) against a fresh release seqline
# and a fresh Synapse from PyPI (and Conduit, given a binary), one server at a
# time, rotating the order round by round, then prints each round's figures
# side by side with ratios.
#
#   bench/compare.sh [--postgres] [--rounds N] [--only seqline|synapse|conduit] [--servers a,b,...] [--out DIR] [seqline-bench flags...]
#   CONDUIT_BIN=/path/to/conduit bench/compare.sh --servers seqline,conduit,synapse --unread
#       Conduit is not built here: CONDUIT_BIN names a binary built elsewhere
#       from its public source (SQLite backend; PostgreSQL runs leave it out).
#   bench/compare.sh --members 100 --messages 1000        # a quick run
#   bench/compare.sh                                        # the chapter: 500 members, 4,900 messages
#   SEQLINE_BIN=/tmp/seqline-old bench/compare.sh --only seqline   # a binary built elsewhere
#
# Everything not listed above is passed to seqline-bench (--members,
# --messages, --concurrency, --wake-samples, --growth ..., see
# `seqline-bench --help`). Synapse is installed once into
# $SYNAPSE_VENV (default ~/.cache/seqline/synapse-venv). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/seqline/target}"
VENV="${SYNAPSE_VENV:-$HOME/.cache/seqline/synapse-venv}"
PG_URL_BASE="postgres://postgres@127.0.0.1:5432"
POSTGRES=0
ROUNDS=1
ONLY=""
SERVERS="seqline,synapse"
OUT=""
BENCH_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --postgres) POSTGRES=1 ;;
    --rounds) ROUNDS="$2"; shift ;;
    --only) ONLY="$2"; shift ;;
    --servers) SERVERS="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    *) BENCH_ARGS+=("$1") ;;
  esac
  shift
done
[ -n "$ONLY" ] && SERVERS="$ONLY"
IFS=, read -r -a SERVER_LIST <<<"$SERVERS"
has_server() { [[ ",$SERVERS," == *",$1,"* ]]; }
OUT="${OUT:-$HOME/.cache/seqline/bench-results/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
BACKEND=sqlite; [ "$POSTGRES" = 1 ] && BACKEND=postgres
echo "results in $OUT (backend $BACKEND)"

# SEQLINE_BENCH_LOG: seqline's log filter (default warn; say seqline=debug to
# read the timings it logs).
# SEQLINE_BIN / SEQLINE_BENCH_BIN: run these binaries as they are (say, a
# copy built from another commit) instead of building the release ones.
SEQLINE="${SEQLINE_BIN:-$CARGO_TARGET_DIR/release/seqline}"
BENCH="${SEQLINE_BENCH_BIN:-$CARGO_TARGET_DIR/release/seqline-bench}"
if [ -z "${SEQLINE_BIN:-}" ]; then
  echo "== building seqline (release)"
  cargo build --release --bin seqline -p seqline --quiet
fi
if [ -z "${SEQLINE_BENCH_BIN:-}" ]; then
  echo "== building seqline-bench (release)"
  cargo build --release --bin seqline-bench -p seqline-bench --quiet
fi
echo "seqline: $SEQLINE"

if has_server conduit && [ ! -x "${CONDUIT_BIN:-}" ]; then
  echo "--servers names conduit: set CONDUIT_BIN to a Conduit binary built from its source" >&2
  exit 2
fi
if has_server synapse; then
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import synapse' 2>/dev/null; then
    echo "== installing Synapse into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet matrix-synapse
  fi
  if [ "$POSTGRES" = 1 ] && ! "$VENV/bin/python" -c 'import psycopg2' 2>/dev/null; then
    "$VENV/bin/pip" install --quiet psycopg2-binary
  fi
  echo "Synapse $("$VENV/bin/python" -c 'import synapse; print(synapse.__version__)')"
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

wait_ready() { # url pid log
  for _ in $(seq 1 240); do
    if curl -fsS "$1/_matrix/client/versions" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then echo "server exited; log:"; tail -n 40 "$3"; return 1; fi
    sleep 0.5
  done
  echo "server did not answer within 120 s; log:"; tail -n 40 "$3"; return 1
}

fresh_pg_db() { # name
  psql -q -h 127.0.0.1 -U postgres -d postgres -c "DROP DATABASE IF EXISTS $1" >/dev/null
  psql -q -h 127.0.0.1 -U postgres -d postgres \
    -c "CREATE DATABASE $1 ENCODING 'UTF8' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0" >/dev/null
}

pg_db_mib() { # name -> MiB
  psql -At -h 127.0.0.1 -U postgres -d postgres -c "SELECT pg_database_size('$1')::float8 / 1048576"
}

# Adds server.db_mib (PostgreSQL) to a report.
add_db_mib() { # json mib
  python3 - "$1" "$2" <<'PY'
import json, sys
path, mib = sys.argv[1], float(sys.argv[2])
r = json.load(open(path))
r["metrics"]["server.db_mib"] = {"value": mib, "unit": "MiB", "better": "lower"}
json.dump(r, open(path, "w"), indent=2)
PY
}

SERVER_PID=""
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

run_seqline() { # round
  local dir="$OUT/seqline-$1" port url db=""
  rm -rf "$dir"; mkdir -p "$dir/data"
  port=$(free_port); url="http://127.0.0.1:$port"
  local envs=(SEQLINE_REGISTRATION=open SEQLINE_RATE_LIMITS=off SEQLINE_LISTEN="127.0.0.1:$port"
              SEQLINE_DATA_DIR="$dir/data" SEQLINE_SERVER_NAME=localhost SEQLINE_LOG="${SEQLINE_BENCH_LOG:-warn}" SEQLINE_PRESENCE=off)
  if [ "$POSTGRES" = 1 ]; then
    db="seqline_bench_$1"; fresh_pg_db "$db"
    envs+=(SEQLINE_DATABASE_URL="$PG_URL_BASE/$db")
  fi
  env "${envs[@]}" "$SEQLINE" serve >"$dir/server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$url" "$SERVER_PID" "$dir/server.log"
  echo "== round $1: seqline at $url (pid $SERVER_PID)"
  local dbarg=(--db-path "$dir/data/seqline.db"); [ "$POSTGRES" = 1 ] && dbarg=()
  "$BENCH" --label seqline --base-url "$url" --server-name localhost --pid "$SERVER_PID" "${dbarg[@]}" \
    --json-out "$dir.json" "${BENCH_ARGS[@]}" | tee "$dir.txt"
  [ "$POSTGRES" = 1 ] && add_db_mib "$dir.json" "$(pg_db_mib "$db")"
  stop_server
}

run_synapse() { # round
  local dir="$OUT/synapse-$1" port url db=""
  rm -rf "$dir"; mkdir -p "$dir"
  port=$(free_port); url="http://127.0.0.1:$port"
  local dbconf
  if [ "$POSTGRES" = 1 ]; then
    db="synapse_bench_$1"; fresh_pg_db "$db"
    dbconf="database:
  name: psycopg2
  args: {user: postgres, host: 127.0.0.1, port: 5432, database: $db, cp_min: 5, cp_max: 10}"
  else
    dbconf="database:
  name: sqlite3
  args: {database: $dir/homeserver.db}"
  fi
  local big="{per_second: 1000000, burst_count: 1000000}"
  cat >"$dir/log.config" <<YAML
version: 1
formatters: {precise: {format: '%(asctime)s - %(name)s - %(levelname)s - %(message)s'}}
handlers: {file: {class: logging.FileHandler, formatter: precise, filename: $dir/homeserver.log}}
root: {level: WARNING, handlers: [file]}
disable_existing_loggers: false
YAML
  cat >"$dir/homeserver.yaml" <<YAML
server_name: localhost
pid_file: $dir/homeserver.pid
listeners:
  - {port: $port, bind_addresses: ['127.0.0.1'], type: http, tls: false, x_forwarded: false,
     resources: [{names: [client], compress: false}]}
$dbconf
log_config: $dir/log.config
media_store_path: $dir/media_store
signing_key_path: $dir/localhost.signing.key
report_stats: false
macaroon_secret_key: "bench-macaroon-$RANDOM$RANDOM"
form_secret: "bench-form-$RANDOM$RANDOM"
registration_shared_secret: "bench-shared-$RANDOM$RANDOM"
enable_registration: true
enable_registration_without_verification: true
trusted_key_servers: []
suppress_key_server_warning: true
federation_domain_whitelist: []
presence: {enabled: false}
rc_message: $big
rc_registration: $big
rc_registration_token_validity: $big
rc_login: {address: $big, account: $big, failed_attempts: $big}
rc_admin_redaction: $big
rc_joins: {local: $big, remote: $big}
rc_joins_per_room: $big
rc_3pid_validation: $big
rc_invites: {per_room: $big, per_user: $big, per_issuer: $big}
rc_third_party_invite: $big
rc_media_create: $big
rc_profile: $big
rc_room_creation: $big
rc_reports: $big
rc_user_directory: $big
rc_key_requests: $big
rc_delayed_event_mgmt: $big
rc_presence: {per_user: $big}
YAML
  "$VENV/bin/python" -m synapse.app.homeserver -c "$dir/homeserver.yaml" --generate-keys >"$dir/stdout.log" 2>&1
  "$VENV/bin/python" -m synapse.app.homeserver -c "$dir/homeserver.yaml" >>"$dir/stdout.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$url" "$SERVER_PID" "$dir/stdout.log"
  echo "== round $1: Synapse at $url (pid $SERVER_PID)"
  local dbarg=(--db-path "$dir/homeserver.db"); [ "$POSTGRES" = 1 ] && dbarg=()
  "$BENCH" --label synapse --base-url "$url" --server-name localhost --pid "$SERVER_PID" "${dbarg[@]}" \
    --json-out "$dir.json" "${BENCH_ARGS[@]}" | tee "$dir.txt"
  [ "$POSTGRES" = 1 ] && add_db_mib "$dir.json" "$(pg_db_mib "$db")"
  stop_server
}

run_conduit() { # round
  local dir="$OUT/conduit-$1" port url
  rm -rf "$dir"; mkdir -p "$dir/data"
  port=$(free_port); url="http://127.0.0.1:$port"
  cat >"$dir/conduit.toml" <<TOML
[global]
server_name = "localhost"
database_backend = "sqlite"
database_path = "$dir/data"
address = "127.0.0.1"
port = $port
allow_registration = true
allow_federation = false
allow_check_for_updates = false
trusted_servers = []
max_request_size = 20_000_000
log = "warn"
TOML
  CONDUIT_CONFIG="$dir/conduit.toml" "$CONDUIT_BIN" >"$dir/server.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$url" "$SERVER_PID" "$dir/server.log"
  # The first account becomes the admin and hears of every later one: a
  # throwaway takes that place.
  curl -fsS -X POST "$url/_matrix/client/v3/register" -H 'Content-Type: application/json' \
    -d '{"username":"bench_admin","password":"bench-admin-pw","auth":{"type":"m.login.dummy"}}' >/dev/null
  echo "== round $1: Conduit at $url (pid $SERVER_PID)"
  "$BENCH" --label conduit --base-url "$url" --server-name localhost --pid "$SERVER_PID" --db-path "$dir/data" \
    --json-out "$dir.json" "${BENCH_ARGS[@]}" | tee "$dir.txt"
  stop_server
}

n=${#SERVER_LIST[@]}
for r in $(seq 1 "$ROUNDS"); do
  # Each round starts one further along the list, so no server always goes first.
  for i in $(seq 0 $((n - 1))); do
    s=${SERVER_LIST[$(((i + r - 1) % n))]}
    if [ "$s" = conduit ] && [ "$POSTGRES" = 1 ]; then echo "== round $r: Conduit has no PostgreSQL backend, left out"; continue; fi
    "run_$s" "$r"
  done
done

if has_server seqline; then
  for r in $(seq 1 "$ROUNDS"); do
    for s in "${SERVER_LIST[@]}"; do
      [ "$s" = seqline ] || [ ! -f "$OUT/$s-$r.json" ] && continue
      echo "== round $r: seqline vs $s ($BACKEND)"
      "$BENCH" --compare "$OUT/seqline-$r.json,$OUT/$s-$r.json" | tee "$OUT/compare-$s-$r.txt"
    done
  done
fi
echo "results in $OUT"
