#!/usr/bin/env bash
# Decode tok/s of `mpiexec -n 2 ds41 run` across two network namespaces (one rank each, TCP
# only) against the link's one-way delay, beside the cost model. The link: a veth pair with
# `tc netem` on both ends where the kernel has the netem qdisc; else (LINK=tap, or no netem) a
# TAP device in each namespace joined by the delay line tests/tools/netdelay (a user-space
# forwarder that writes each frame DELAY us after it read it; tests/netdelay.test.sh checks the
# round trip). The first line says which emulated the link.
# Cost model, per decode step: --split experts (the default) waits one one-way delay per MoE
# exchange (every layer), t(d) = t(0) + layers x d (rank 0 only sends the step plan, and its
# follower receives it within the delay it gained at the last exchange: the broadcasts and
# the Engram exchange add no delay of their own; the first model here, (layers + 2) x d,
# counted them and was 2 delays above the measured slope); --split layers waits for the
# residual stream's hop to the last stage and the logits' way back, t(d) = t(0) + 2 x d.
# Last line per split: the least-squares slope of the step time against d, in delays per step.
# Rounds interleave the delays and the splits. Needs root (ip netns, tc or /dev/net/tun).
# docs/distributed.md ("Link latency").
# RATES="none 10mbit" (tc's units; none: no limit) also limits each direction to each rate in
# turn, interleaved with the rest: tbf on both TAP devices, or netem's own rate on the veth pair.
#   bench/mpi_netem.sh CKPT [ROUNDS] [DELAYS_US...]        SPLITS="experts layers" to add the layer split
set -u
ck=${1:?checkpoint}; rounds=${2:-3}; shift 2 2>/dev/null || shift $#
delays=${*:-0 50 200 1000}
splits=${SPLITS:-experts}
DS41=${DS41:-./ds41}
ND=${NETDELAY:-build/tests/tools/netdelay}
case $ck in /*) ;; *) ck=$PWD/$ck ;; esac
case $DS41 in /*) ;; *) DS41=$PWD/$DS41 ;; esac
case $ND in /*) ;; *) ND=$PWD/$ND ;; esac
NS=ds41n$$ TMP=$(mktemp -d /tmp/ds41-netem.XXXXXX)
. "$(dirname "$0")/../tests/netns.sh"
trap 'ns_cleanup; rm -rf "$TMP"' EXIT
link=${LINK:-netem}
if [ "$link" = netem ]; then
    ip netns add "${NS}0" && ip netns add "${NS}1" &&
        ip link add "${NS}a" netns "${NS}0" type veth peer name "${NS}b" netns "${NS}1" || exit 1
    # the kernel needs the netem qdisc (sch_netem); without it every delay would silently be 0
    if tc -n "${NS}0" qdisc add dev "${NS}a" root netem delay 1us 2>"$TMP/tc.err"; then
        tc -n "${NS}0" qdisc del dev "${NS}a" root
    else
        echo "bench/mpi_netem.sh: tc netem is not available on this kernel ($(head -c 120 "$TMP/tc.err" | tr '\n' ' ')); using the delay line $ND" >&2
        ns_cleanup
        link=tap
    fi
fi
if [ "$link" = tap ]; then
    [ -x "$ND" ] || { echo "bench/mpi_netem.sh: no delay line at $ND (make builds it)" >&2; exit 1; }
    ns_tap_pair || exit 1
    ns_delay "$ND" 0 "$TMP/nd.log" || { echo "bench/mpi_netem.sh: netdelay: $(cat "$TMP/nd.log")" >&2; exit 1; }
fi
ns_pair_up
ns_launcher "$TMP/launch"
rates=${RATES:-none} rate=""
set_rate() {   # set_rate RATE|none (the veth's netem takes it with the delay)
    rate=$1; [ "$rate" = none ] && rate=""
    [ "$link" = tap ] || return 0
    local x
    for x in "0 a" "1 b"; do
        set -- $x
        tc -n "${NS}$1" qdisc del dev "${NS}$2" root 2>/dev/null
        # the frames leave each namespace through its TAP at the rate; the bucket holds one 9000-byte
        # frame and no more, so that a step cannot pass as one burst
        if [ -n "$rate" ] && ! tc -n "${NS}$1" qdisc add dev "${NS}$2" root tbf rate "$rate" burst 9kb latency 200ms; then
            echo "bench/mpi_netem.sh: tbf rate $rate failed" >&2
            exit 1
        fi
    done
}
layers=$("$DS41" inspect --json "$ck" | python3 -c "import json,sys; print(json.load(sys.stdin)['config']['n_layers'])")
set_delay() {   # set_delay US
    if [ "$link" = tap ]; then
        ns_delay "$ND" "$1" "$TMP/nd.log" || { echo "bench/mpi_netem.sh: netdelay $1: $(cat "$TMP/nd.log")" >&2; exit 1; }
        return
    fi
    local x
    for x in "0 a" "1 b"; do
        set -- "$1" $x
        tc -n "${NS}$2" qdisc del dev "${NS}$3" root 2>/dev/null
        if { [ "$1" != 0 ] || [ -n "$rate" ]; } && ! tc -n "${NS}$2" qdisc add dev "${NS}$3" root netem delay "${1}us" ${rate:+rate "$rate"}; then
            echo "bench/mpi_netem.sh: tc netem delay ${1}us failed" >&2
            exit 1
        fi
    done
}
for r in $(seq 1 "$rounds"); do
    for rt in $rates; do
        set_rate "$rt"
        for d in $delays; do
            set_delay "$d"
            for sp in $splits; do
                # a run that fails is said and run once more (seen twice in 150 runs, docs/distributed.md
                # "Link latency"); a second failure ends the script
                for try in 1 2; do
                    MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NOLOCAL=1 UCX_TLS=tcp,self timeout 600 mpiexec -n 2 "$TMP/launch" \
                        "$DS41" run -m "$ck" --prompt-ids 1,2,3,4,5,6,7,8 -n 33 --ignore-eos --spec off --mpi-timeout 60 \
                        --split "$sp" >"$TMP/o.$rt.$sp.$d.$r" 2>"$TMP/e.$rt.$sp.$d.$r" && break
                    echo "rate $rt, delay $d, --split $sp, try $try failed: $(tail -n 2 "$TMP/e.$rt.$sp.$d.$r" | tr '\n' ' ')" >&2
                    [ "$try" = 2 ] && exit 1
                done
            done
            # the delay line's own error: how late it wrote the frames past their due time
            [ "$link" = tap ] && { kill "$NS_DELAY_PID"; wait "$NS_DELAY_PID"; NS_DELAY_PID=; sed "s/^/  $d us round $r: /" "$TMP/nd.log" | grep -v one-way >&2; }
        done
    done
done
if [ "$link" = tap ]; then echo "link: TAP devices joined by tests/tools/netdelay (no netem qdisc on this kernel), tbf for the rates"
else echo "link: veth pair with tc netem delay (and rate) on both ends"; fi
python3 - "$TMP" "$rounds" "$layers" "$splits" "$rates" $delays <<'PY'
import json, re, statistics, sys
tmp, rounds, L, splits, rates = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(), sys.argv[5].split()
ds = [int(x) for x in sys.argv[6:]]
def tps(path):
    # rank 0's "ds41 run: ... decode N tokens in S s (T tok/s)" (no --json: its top logprobs
    # would bring the whole logits row to rank 0 under --split layers, not only the ids)
    m = re.search(r"decode \d+ tokens in [0-9.]+ s \(([0-9.]+) tok/s\)", open(path).read())
    if not m: raise SystemExit("no timing line in " + path)
    return float(m.group(1))
print("%-8s %-8s %-10s %12s %14s %16s" % ("rate", "split", "delay us", "decode t/s", "step ms", "model step ms"))
for rt in rates:
  for sp in splits:
    t0 = None
    per = L if sp == "experts" else 2   # one-way delays a decode step waits for
    xs, ys = [], []
    for d in ds:
        v = statistics.median(tps(f"{tmp}/e.{rt}.{sp}.{d}.{r}") for r in range(1, rounds + 1))
        step = 1000.0 / v; t0 = t0 if t0 is not None else step
        xs.append(d / 1000.0); ys.append(step)
        print("%-8s %-8s %-10d %12.2f %14.2f %16.2f" % (rt, sp, d, v, step, t0 + per * d / 1000.0))
    if len(xs) > 1:
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        print("%-8s %-8s slope %.2f delays per step (model %d)" % (rt, sp, slope, per))
PY
