#!/usr/bin/env bash
# Creates (once) the venv the real-client test runs matrix-nio from:
#   ${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}/nio-venv
# with requirements.txt installed. Idempotent: when the venv exists and was built
# from this exact requirements.txt with this Python, it only prints the venv's
# python and exits. Safe to run concurrently (flock). Prints the venv's python
# path as its last line; exits non-zero with a reason on any failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}"
venv="$cache/nio-venv"
python="${SEQLINE_PYTHON:-python3}"
req="$here/requirements.txt"

fail() { echo "nio setup: $*" >&2; exit 1; }

command -v "$python" >/dev/null || fail "$python not found (matrix-nio needs Python 3.9 or newer)"
mkdir -p "$cache"

# The stamp: what the venv was built from (requirements and interpreter).
want="$( (cat "$req"; "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -d' ' -f1)"

exec 9>"$cache/nio-venv.lock"
flock 9

if [[ -x "$venv/bin/python" && -f "$venv/.seqline-stamp" && "$(cat "$venv/.seqline-stamp")" == "$want" ]]; then
  echo "$venv/bin/python"
  exit 0
fi

echo "nio setup: building $venv from $req" >&2
rm -rf "$venv"
"$python" -m venv "$venv" || fail "could not create a venv with $python -m venv"
if ! "$venv/bin/pip" install --disable-pip-version-check --no-input --quiet \
      --timeout 30 --retries 2 -r "$req" >&2; then
  rm -rf "$venv"
  fail "pip install -r $req failed (is PyPI reachable? see pip's output above)"
fi
"$venv/bin/python" -c 'import nio, nio.crypto; assert nio.crypto.ENCRYPTION_ENABLED, "nio has no encryption support"' \
  || { rm -rf "$venv"; fail "matrix-nio installed but does not import with encryption enabled"; }
echo "$want" > "$venv/.seqline-stamp"
echo "$venv/bin/python"
