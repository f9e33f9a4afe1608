# Two network namespaces ${NS}0 and ${NS}1 joined by the veth pair ${NS}a / ${NS}b (made by the
# caller), for mpiexec ranks on separate "hosts". Sourced by tests/mpi.test.sh and
# bench/mpi_netem.sh; needs root.

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
        [ "$(ip netns exec "${NS}0" cat "/sys/class/net/${NS}a/operstate")" = up ] &&
            [ "$(ip netns exec "${NS}1" cat "/sys/class/net/${NS}b/operstate")" = up ] && return 0
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
