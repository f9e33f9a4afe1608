#!/usr/bin/env bash
# Decode tok/s of `mpiexec -n 2 ds41 run` across two network namespaces (one rank each, a
# veth pair, TCP only) against the link's one-way delay (tc netem on both ends), beside the
# cost model: every forward waits for 2 broadcasts of rank 0's step plan and one expert
# exchange per MoE layer, each about one one-way delay, so t(d) = t(0) + (layers + 2) x d.
# Rounds interleave the delays. Needs root (ip netns, tc). docs/distributed.md.
#   bench/mpi_netem.sh CKPT [ROUNDS] [DELAYS_US...]
set -u
ck=${1:?checkpoint}; rounds=${2:-3}; shift 2 2>/dev/null || shift $#
delays=${*:-0 50 200 1000}
DS41=${DS41:-./ds41}
case $ck in /*) ;; *) ck=$PWD/$ck ;; esac
case $DS41 in /*) ;; *) DS41=$PWD/$DS41 ;; esac
NS=ds41n$$ TMP=$(mktemp -d /tmp/ds41-netem.XXXXXX)
cleanup() { ip netns del "${NS}0" 2>/dev/null; ip netns del "${NS}1" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
ip netns add "${NS}0" && ip netns add "${NS}1" &&
    ip link add "${NS}a" netns "${NS}0" type veth peer name "${NS}b" netns "${NS}1" || exit 1
# the kernel needs the netem qdisc (sch_netem); without it every delay would silently be 0
if ! tc -n "${NS}0" qdisc add dev "${NS}a" root netem delay 1us 2>"$TMP/tc.err"; then
    echo "bench/mpi_netem.sh: tc netem is not available on this kernel ($(head -c 200 "$TMP/tc.err")); nothing measured" >&2
    exit 1
fi
tc -n "${NS}0" qdisc del dev "${NS}a" root
. "$(dirname "$0")/../tests/netns.sh"
ns_pair_up
ns_launcher "$TMP/launch"
layers=$("$DS41" inspect --json "$ck" | python3 -c "import json,sys; print(json.load(sys.stdin)['config']['n_layers'])")
for r in $(seq 1 "$rounds"); do
    for d in $delays; do
        for x in "0 a" "1 b"; do
            set -- $x
            tc -n "${NS}$1" qdisc del dev "${NS}$2" root 2>/dev/null
            if [ "$d" != 0 ] && ! tc -n "${NS}$1" qdisc add dev "${NS}$2" root netem delay "${d}us"; then
                echo "bench/mpi_netem.sh: tc netem delay ${d}us failed" >&2
                exit 1
            fi
        done
        MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NOLOCAL=1 UCX_TLS=tcp,self timeout 600 mpiexec -n 2 "$TMP/launch" \
            "$DS41" run -m "$ck" --prompt-ids 1,2,3,4,5,6,7,8 -n 33 --ignore-eos --spec off --json --mpi-timeout 60 \
            >"$TMP/o.$d.$r" 2>"$TMP/e.$d.$r" || { echo "delay $d failed: $(tail -n 2 "$TMP/e.$d.$r")" >&2; exit 1; }
    done
done
python3 - "$TMP" "$rounds" "$layers" $delays <<'PY'
import json, statistics, sys
tmp, rounds, L, ds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(x) for x in sys.argv[4:]]
def tps(path):
    for line in open(path):
        o = json.loads(line)
        if "timing" in o: return o["timing"]["decode_tokens_per_s"]
    raise SystemExit("no timing line in " + path)
print("%-10s %12s %14s %16s" % ("delay us", "decode t/s", "step ms", "model step ms"))
t0 = None
for d in ds:
    v = statistics.median(tps(f"{tmp}/o.{d}.{r}") for r in range(1, rounds + 1))
    step = 1000.0 / v; t0 = t0 if t0 is not None else step
    print("%-10d %12.2f %14.2f %16.2f" % (d, v, step, t0 + (L + 2) * d / 1000.0))
PY
