# Sourced by bench/pd_bytes.sh and bench/pd_memory.sh (docs/pd.md): scratch, cleanup and a
# prefill node + decode node pair on $M (exact kernels, spec off, context 4096) on free ports.
# DS41=BINARY measures another build; PD_DECODER=prefill|decode passes --pd-decoder to the
# prefill node (unset: none, for a build without it).
DS41=${DS41:-./ds41}
TMP=$(mktemp -d /tmp/ds41-pdbench.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$TMP"' EXIT
waitport() { for _ in $(seq 1 600); do p=$(sed -n "s/.*$2\([0-9]*\).*/\1/p" "$1" 2>/dev/null | head -n 1); [ -n "$p" ] && { echo "$p"; return 0; }; sleep 0.1; done; return 1; }
# start_pair -> PP, DP (pids), port (the decode node's HTTP port); logs $TMP/p.log, $TMP/d.log
start_pair() {
    "$DS41" serve -m "$M" --exact -c 4096 --spec off --role prefill --port 0 ${PD_DECODER:+--pd-decoder $PD_DECODER} \
        >"$TMP/p.log" 2>&1 &
    PP=$!; PIDS+=($PP)
    local pport
    pport=$(waitport "$TMP/p.log" 'listening on ucx:\/\/127.0.0.1:') || { cat "$TMP/p.log"; exit 1; }
    "$DS41" serve -m "$M" --exact -c 4096 --spec off --role decode --prefill 127.0.0.1:$pport --port 0 >"$TMP/d.log" 2>&1 &
    DP=$!; PIDS+=($DP)
    port=$(waitport "$TMP/d.log" 'listening on http:\/\/127.0.0.1:') || { cat "$TMP/d.log"; exit 1; }
}
# modes: the --pd-decoder values a script measures in one run (PD_DECODERS, default both;
# "-" for a build without the option)
pd_modes() { echo "${PD_DECODERS:-prefill decode}"; }
pd_mode() { [ "$1" = - ] && unset PD_DECODER || PD_DECODER=$1; }
