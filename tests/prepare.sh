#!/usr/bin/env bash
# Writes the generated checkpoints several shell tests share (build/test-ck) before tests/run.sh
# starts its two lanes, so that no two tests write the same checkpoint at the same time.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
CK=build/test-ck
TMP=$(mktemp -d /tmp/ds41-prepare.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$CK"
. tests/lib.sh
# PREPARE=small (the default: all): the small checkpoints and serve's; PREPARE=prodslice: the
# 4.9 GB production-width slice alone (tests/run.sh writes it in the background while the C unit
# tests run, none of which reads it)
case ${PREPARE:-all} in
    all|small)
        for n in tiny small43; do checkpoint "$n" >/dev/null || exit 1; done
        serve_checkpoint >/dev/null || exit 1 ;;
esac
case ${PREPARE:-all} in
    all|prodslice) checkpoint prodslice >/dev/null || exit 1 ;;
esac
