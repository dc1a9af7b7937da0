#!/usr/bin/env bash
# Creates (once) the venv the federation tests run Synapse from:
#   ${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}/synapse-venv
# with requirements.txt installed (wheels only). Idempotent: when the venv exists
# and was built from this exact requirements.txt with this Python, it only prints
# the venv's python and exits. Safe to run concurrently (flock). Prints the venv's
# python path as its last line; exits non-zero with a reason on any failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}"
venv="$cache/synapse-venv"
python="${SEQLINE_PYTHON:-python3}"
req="$here/requirements.txt"

fail() { echo "synapse setup: $*" >&2; exit 1; }

command -v "$python" >/dev/null || fail "$python not found (Synapse 1.163 needs Python 3.10 or newer)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || fail "$("$python" --version 2>&1) is too old (Synapse 1.163 needs Python 3.10 or newer; set SEQLINE_PYTHON)"
mkdir -p "$cache"

# The stamp: what the venv was built from (requirements and interpreter).
want="$( (cat "$req"; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"

exec 9>"$cache/synapse-venv.lock"
flock 9

if [[ -x "$venv/bin/python" && -f "$venv/.seqline-stamp" && "$(cat "$venv/.seqline-stamp")" == "$want" ]]; then
  echo "$venv/bin/python"
  exit 0
fi

echo "synapse setup: building $venv from $req" >&2
rm -rf "$venv"
"$python" -m venv "$venv" || fail "could not create a venv with $python -m venv"
if ! "$venv/bin/pip" install --disable-pip-version-check --no-input --quiet \
      --timeout 30 --retries 2 -r "$req" >&2; then
  rm -rf "$venv"
  fail "pip install -r $req failed (is PyPI reachable? does every pin have a wheel for this Python? see pip's output above)"
fi
"$venv/bin/python" -c 'import synapse.app.homeserver, synapse.synapse_rust' \
  || { rm -rf "$venv"; fail "matrix-synapse installed but synapse.app.homeserver does not import"; }
echo "$want" > "$venv/.seqline-stamp"
echo "$venv/bin/python"
