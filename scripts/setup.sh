#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks for ds41: build tools and libraries (apt, as
# root), Debian's Python numpy for the reference and tools, and the npm packages used as test
# oracles (tests/oracle/). Idempotent and quick when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."
APT_PKGS="gcc make pkg-config bc clang libclang-rt-14-dev libjansson-dev libpcre2-dev libutf8proc-dev libedit-dev libmicrohttpd-dev python3 python3-numpy nodejs npm"
# Image input (src/image/): libpng and libjpeg-turbo; Pillow is the preprocessing oracle of tests/image_test.py
APT_PKGS="$APT_PKGS libpng-dev libjpeg62-turbo-dev python3-pil"
# Deployment: MPICH (mpiexec scale-out), liburing (Engram rows off RAM), UCX (prefill/decode
# KV transfer), iproute2 (the network-namespace tests); matplotlib for make bench's plots.
APT_PKGS="$APT_PKGS mpich libmpich-dev liburing-dev libucx-dev iproute2 python3-matplotlib"
# The demo model's data (tests rebuild its held-out split) and Debian's CPU torch with OpenBLAS
# (the torch twin is the second implementation the demo-model tests compare ds41 against).
APT_PKGS="$APT_PKGS bible-kjv bible-kjv-text fortunes fortunes-min jargon-text dict-gcide python3-torch libopenblas0-pthread"
# make train-demo: the trainer also plots its loss curve
[ "${DS41_SETUP_TRAIN:-0}" = 1 ] && APT_PKGS="$APT_PKGS python3-matplotlib"
missing=""
for p in $APT_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# nodejs/npm may already come from elsewhere (node on PATH): do not fight it, and do not run
# apt-get (its index update alone takes a minute) for them on every make test.
if command -v npm >/dev/null 2>&1; then missing=$(echo "$missing" | sed 's/ nodejs//; s/ npm//'); fi
if [ -n "${missing// /}" ]; then
    echo "setup: installing Debian packages:$missing"
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: need root to apt-get install:$missing" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $missing >/dev/null
fi
if [ -f tests/oracle/package.json ]; then
    if [ ! -f tests/oracle/node_modules/.ds41-installed ] || [ tests/oracle/package.json -nt tests/oracle/node_modules/.ds41-installed ]; then
        echo "setup: installing npm test oracles (tests/oracle)"
        (cd tests/oracle && if [ -f package-lock.json ]; then npm ci --no-audit --no-fund --loglevel=error; else npm install --no-audit --no-fund --loglevel=error; fi)
        touch tests/oracle/node_modules/.ds41-installed
    fi
fi
