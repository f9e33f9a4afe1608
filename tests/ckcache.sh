#!/usr/bin/env bash
# tests/ckcache.sh OUT CONFIG_DIR [make_checkpoint.py ARGS...]
# The checkpoint tools/make_checkpoint.py writes from CONFIG_DIR (its config.json) with ARGS,
# written once per content into build/test-ck/gen/KEY (KEY: a SHA-256 of the config, the
# arguments and the generator's source) and OUT made a directory of symbolic links to its files
# (files a test adds to OUT stay in OUT). The C tests of the normal and the sanitizer builds,
# in both lanes of tests/run.sh, share one write of each checkpoint; a changed config, argument
# or generator is a new key. Writers of one key take turns (flock). Exit status 0: OUT is ready.
set -u
if [ $# -lt 2 ] || [ ! -f "$2/config.json" ]; then
    echo "ckcache.sh: usage: ckcache.sh OUT CONFIG_DIR [make_checkpoint.py ARGS...] (CONFIG_DIR/config.json must exist)" >&2
    exit 2
fi
out=$1 cfg=$2
shift 2
root=${DS41_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
py=${PYTHON:-/usr/bin/python3}
gen=$root/tools/make_checkpoint.py
cache=$root/build/test-ck/gen
key=$({ cat "$cfg/config.json" "$gen"; printf '%s\n' "--" "$@"; } | sha256sum | cut -c1-32) || exit 1
mkdir -p "$cache" || exit 1
dir=$cache/$key
{
    flock 9 || exit 1
    if [ ! -f "$dir/.complete" ]; then
        rm -rf "$dir" && mkdir -p "$dir" || exit 1
        "$py" "$gen" "$cfg" "$dir" "$@" || { rm -rf "$dir"; exit 1; }
        touch "$dir/.complete"
    fi
} 9>"$dir.lock" || exit 1
rm -rf "$out" && mkdir -p "$out" || exit 1
for f in "$dir"/*; do ln -s "$f" "$out/$(basename "$f")" || exit 1; done
touch "$out/.complete"
