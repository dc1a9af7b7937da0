#!/usr/bin/env bash
# Builds (once) the matrix-rust-sdk probe the real-client test runs:
#   ${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}/rust-sdk/rust-sdk-probe
# from this directory's own Cargo project (matrix-sdk and matrix-sdk-ui
# =0.18.0, exactly as Cargo.lock pins them) with `cargo build --locked`, its
# target directory under rust-sdk/target there (debug profile without debug
# info). A cold build compiles about 300 crates (several minutes on 2 cores).
#
# Idempotent: when the binary was built from this exact Cargo.toml, Cargo.lock
# and src/main.rs with this rustc, it only prints its path and exits. Safe to
# run concurrently (flock). Prints the binary's path as its last line; exits
# non-zero with a reason on any failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}"
dir="$cache/rust-sdk"
bin="$dir/rust-sdk-probe"
cargo="${CARGO:-cargo}"

fail() { echo "rust-sdk setup: $*" >&2; exit 1; }

command -v "$cargo" >/dev/null || fail "$cargo not found (the probe is built with cargo from crates.io sources)"
rustc_version="$("${RUSTC:-rustc}" --version)" || fail "rustc not found"
mkdir -p "$dir"

# The stamp: what the binary was built from (manifest, lock file, source, compiler).
want="$( (cat "$here/Cargo.toml" "$here/Cargo.lock" "$here/src/main.rs"; echo "$rustc_version") \
  | sha256sum | cut -d' ' -f1)"

exec 9>"$dir.lock"
flock 9

if [[ -x $bin && -f "$dir/.seqline-stamp" && "$(cat "$dir/.seqline-stamp")" == "$want" ]]; then
  echo "$bin"
  exit 0
fi

echo "rust-sdk setup: building the probe into $dir/target ($rustc_version)" >&2
rm -f "$dir/.seqline-stamp"
started=$SECONDS
# The probe is its own workspace: nothing of the caller's build applies to it.
if ! (cd "$here" && env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET_DIR CARGO_TARGET_DIR="$dir/target" \
      "$cargo" build --locked --bin rust-sdk-probe >&2); then
  fail "cargo build --locked failed (crates.io is needed on the first build; see cargo's output above)"
fi
cp "$dir/target/debug/rust-sdk-probe" "$bin.new" && mv "$bin.new" "$bin" \
  || fail "could not copy the built probe to $bin"
echo "rust-sdk setup: built in $((SECONDS - started)) s" >&2
echo "$want" > "$dir/.seqline-stamp"
echo "$bin"
