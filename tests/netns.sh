# Two network namespaces ${NS}0 and ${NS}1 joined by the veth pair ${NS}a / ${NS}b (made by the
# caller), or by the TAP devices ${NS}a / ${NS}b and the delay line between them (ns_tap_pair),
# for mpiexec ranks on separate "hosts". Sourced by tests/mpi.test.sh, tests/netdelay.test.sh
# and bench/mpi_netem.sh; needs root.

# A /30 subnet picked at random on the pair, both ends and lo up; returns once both ends report
# up (UCX's first address exchange fails on a link still coming up).
ns_pair_up() {
    local sub=10.$((RANDOM % 200 + 20)).$((RANDOM % 250)) i
    ip -n "${NS}0" addr add "$sub.1/30" dev "${NS}a"
    ip -n "${NS}1" addr add "$sub.2/30" dev "${NS}b"
    for i in 0 1; do ip -n "${NS}$i" link set lo up; done
    ip -n "${NS}0" link set "${NS}a" up
    ip -n "${NS}1" link set "${NS}b" up
    for i in $(seq 1 50); do
        # a TAP reports no link state ("unknown") once up and attached
        case $(ip netns exec "${NS}0" cat "/sys/class/net/${NS}a/operstate") in up|unknown) ;; *) sleep 0.1; continue ;; esac
        case $(ip netns exec "${NS}1" cat "/sys/class/net/${NS}b/operstate") in up|unknown) return 0 ;; esac
        sleep 0.1
    done
}

# ns_launcher FILE: writes the launcher mpiexec runs each rank through: rank R enters ${NS}R,
# its UCX on its veth end.
ns_launcher() {
    cat >"$1" <<EOS
#!/bin/sh
d=${NS}a; [ "\$PMI_RANK" = 1 ] && d=${NS}b
exec ip netns exec ${NS}\$PMI_RANK env UCX_NET_DEVICES=\$d "\$@"
EOS
    chmod +x "$1"
}

# ns_tap_pair: the namespaces and a persistent TAP device in each (${NS}a in ${NS}0, ${NS}b in
# ${NS}1), MTU 9000, for tests/tools/netdelay to join (ns_delay); 0 or 1.
ns_tap_pair() {
    ip netns add "${NS}0" && ip netns add "${NS}1" &&
        ip -n "${NS}0" tuntap add dev "${NS}a" mode tap && ip -n "${NS}1" tuntap add dev "${NS}b" mode tap &&
        ip -n "${NS}0" link set "${NS}a" mtu 9000 && ip -n "${NS}1" link set "${NS}b" mtu 9000
}

# ns_delay NETDELAY US LOG: (re)starts the delay line between the two TAPs with a one-way delay
# of US microseconds, its stderr to LOG; NS_DELAY_PID is its pid. Returns once it is attached.
ns_delay() {
    [ -n "${NS_DELAY_PID:-}" ] && { kill "$NS_DELAY_PID" 2>/dev/null; wait "$NS_DELAY_PID" 2>/dev/null; }
    # real-time priority where allowed: on a loaded machine an ordinary process wakes late
    # and every such wake-up would add to the delay (it sleeps between frames, so it costs
    # nothing while idle)
    local rt=""
    chrt -f 10 true 2>/dev/null && rt="chrt -f 10"
    $rt "$1" "$2" "${NS}0:${NS}a" "${NS}1:${NS}b" 2>"$3" &
    NS_DELAY_PID=$!
    local i
    for i in $(seq 1 50); do
        grep -q "one-way delay" "$3" 2>/dev/null && return 0
        kill -0 "$NS_DELAY_PID" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# ns_cleanup: the delay line (if any) and both namespaces, with the devices in them
ns_cleanup() {
    [ -n "${NS_DELAY_PID:-}" ] && { kill "$NS_DELAY_PID" 2>/dev/null; wait "$NS_DELAY_PID" 2>/dev/null; }
    NS_DELAY_PID=
    ip netns del "${NS}0" 2>/dev/null
    ip netns del "${NS}1" 2>/dev/null
}
