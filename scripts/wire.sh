#!/usr/bin/env bash
# A shaped "wire" between the target and initiator hosts on this machine:
# one network namespace per initiator host, joined to the root namespace by a
# veth pair, shaped with tc tbf in both directions. Traffic stays between
# these namespaces; nothing leaves the machine.
#
#   scripts/wire.sh up   HOSTS RATE [DELAY]   e.g. up 2 2gbit 100us
#   scripts/wire.sh down HOSTS
#
# Host i (1-based) is namespace iopace-h$i with address 10.77.$i.2; the
# target side of its veth is 10.77.$i.1 in the root namespace.
set -euo pipefail

need() {
    command -v "$1" >/dev/null 2>&1 || { echo "wire: missing '$1': apt-get install $2" >&2; exit 1; }
}
need ip iproute2
need tc iproute2

ns() { echo "iopace-h$1"; }
host_if() { echo "ipw$1h"; }
tgt_if() { echo "ipw$1t"; }

shape() { # dev rate delay
    local dev=$1 rate=$2 delay=$3 ns_exec=${4:-}
    # tbf's burst must exceed one GSO super-packet (64 KiB) or it stalls.
    $ns_exec tc qdisc replace dev "$dev" root handle 1: tbf rate "$rate" burst 512kb latency 20ms
    if [ -n "$delay" ] && [ "$delay" != 0 ]; then
        $ns_exec tc qdisc replace dev "$dev" parent 1:1 handle 10: netem delay "$delay"
    fi
}

up() {
    local hosts=$1 rate=$2 delay=${3:-0}
    for i in $(seq "$hosts"); do
        down_one "$i"
        ip netns add "$(ns "$i")"
        ip link add "$(tgt_if "$i")" type veth peer name "$(host_if "$i")"
        ip link set "$(host_if "$i")" netns "$(ns "$i")"
        ip addr add "10.77.$i.1/24" dev "$(tgt_if "$i")"
        ip link set "$(tgt_if "$i")" up
        ip netns exec "$(ns "$i")" ip addr add "10.77.$i.2/24" dev "$(host_if "$i")"
        ip netns exec "$(ns "$i")" ip link set "$(host_if "$i")" up
        ip netns exec "$(ns "$i")" ip link set lo up
        shape "$(tgt_if "$i")" "$rate" "$delay"
        shape "$(host_if "$i")" "$rate" "$delay" "ip netns exec $(ns "$i")"
    done
}

down_one() {
    ip link del "$(tgt_if "$1")" 2>/dev/null || true
    ip netns del "$(ns "$1")" 2>/dev/null || true
}

down() {
    for i in $(seq "$1"); do down_one "$i"; done
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) shift; down "$@" ;;
    *) echo "usage: $0 up HOSTS RATE [DELAY] | down HOSTS" >&2; exit 2 ;;
esac
