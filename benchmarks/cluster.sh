#!/bin/bash
# An emulated cluster on one machine: N hosts as network namespaces, each with its own address and
# a veth link to a bridge in a "switch" namespace, every link limited by a tc tbf (both
# directions), and an Open MPI rsh agent that starts commands in a host's namespace under its own
# host name (unshare --uts). Traffic only ever flows between these namespaces (private addresses,
# HVDC_SUBNET, default 10.77.0.0/24) and loopback.
#
#   benchmarks/cluster.sh up [N_HOSTS=2] [RATE=1gbit] [DELAY=0ms]   create (after a 'down')
#   benchmarks/cluster.sh rate RATE [DELAY]                          re-shape every link
#   benchmarks/cluster.sh run [--per-host K] [--timeout S] [--] PROG [ARGS...]
#        mpirun across the hosts (K ranks per host, default 2), PROG started on every rank; the
#        whole job is killed after S seconds (default 600) and leftover processes are reaped.
#   benchmarks/cluster.sh exec HOST_INDEX CMD [ARGS...]             one command on one host
#   benchmarks/cluster.sh status                                    what exists, and the shaping
#   benchmarks/cluster.sh down                                      remove everything (idempotent)
#
# Environment: HVDC_PREFIX (names of namespaces/state, default "hvdc"; tests use another so they
# never touch a running benchmark), HVDC_SUBNET (first three octets, default 10.77.0),
# HVDC_MTU (default 1500), HVDC_STATE (state folder, default /run/hvdc-$HVDC_PREFIX).
#
# Names: namespaces $P-sw (bridge br0, one port per host: h0, h1, ...) and $P-h0, $P-h1, ...; in
# every host namespace the link is "cl0" with address $SUBNET.(10+i); host names h0, h1, ...
# (prefixed by the prefix when it is not "hvdc"). Nothing is written outside the state folder
# (no /etc/hosts entries: mpirun is given IP addresses).
#
# Delay: netem (the usual way to add delay) needs the sch_netem kernel module; where it is missing
# (e.g. this project's VMs) 'up' says so, records delay "unsupported" in the state and goes on
# with the rate limit only.
set -euo pipefail

P=${HVDC_PREFIX:-hvdc}
SUBNET=${HVDC_SUBNET:-10.77.0}
MTU=${HVDC_MTU:-1500}
STATE=${HVDC_STATE:-/run/hvdc-$P}
IFACE=cl0
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")

die() { echo "cluster.sh: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

host_name() { if [ "$P" = hvdc ]; then echo "h$1"; else echo "$P-h$1"; fi; }
host_ip() { echo "$SUBNET.$((10 + $1))"; }

# tc rate string -> bytes per second (accepts bit, kbit, mbit, gbit; bps forms are refused)
rate_bytes() {
    local r=${1,,}
    case "$r" in
        *gbit) echo $(( ${r%gbit} * 1000000000 / 8 ));;
        *mbit) echo $(( ${r%mbit} * 1000000 / 8 ));;
        *kbit) echo $(( ${r%kbit} * 1000 / 8 ));;
        *bit) echo $(( ${r%bit} / 8 ));;
        *) die "rate must look like 100mbit, 1gbit, 10gbit (got '$1')";;
    esac
}

our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(sw|h[0-9]+)$" || true; }

shape_link() {  # namespace device rate delay -> sets the qdisc, prints "ok" or "nodelay"
    local ns=$1 dev=$2 rate=$3 delay=$4 bps burst
    bps=$(rate_bytes "$rate")
    # burst: at least 4 ms worth of bytes (a 250 Hz timer tick) and 64 KiB, so tbf can reach
    # the rate; queue limit through 'latency'
    burst=$(( bps / 250 )); [ "$burst" -lt 65536 ] && burst=65536
    tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
    if [ -n "$delay" ] && [ "$delay" != 0 ] && [ "$delay" != 0ms ]; then
        if tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null; then
            tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" \
                burst "$burst" latency 100ms
            echo ok; return
        fi
        tc -n "$ns" qdisc del dev "$dev" root 2>/dev/null || true
        tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
        echo nodelay; return
    fi
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
    echo ok
}

cmd_rate() {
    local rate=${1:?rate} delay=${2:-0ms} n i res delay_state=applied
    [ -f "$STATE/hosts" ] || die "no cluster '$P' (run 'up' first)"
    n=$(wc -l < "$STATE/hosts")
    [ "$delay" = 0 ] || [ "$delay" = 0ms ] && delay_state=none
    for ((i = 0; i < n; i++)); do
        res=$(shape_link "$P-h$i" "$IFACE" "$rate" "$delay")      # host -> switch
        res2=$(shape_link "$P-sw" "h$i" "$rate" "$delay")         # switch -> host
        if [ "$res" = nodelay ] || [ "$res2" = nodelay ]; then delay_state=unsupported; fi
    done
    if [ "$delay_state" = unsupported ]; then
        log "WARNING: netem is not available in this kernel: delay $delay NOT applied (rate only)"
    fi
    printf 'rate=%s\ndelay=%s\ndelay_state=%s\nhosts=%s\n' "$rate" "$delay" "$delay_state" "$n" \
        > "$STATE/shape"
}

write_agent() {
    # Open MPI calls: AGENT [options] HOST COMMAND... ; HOST is one of our IP addresses.
    cat > "$STATE/agent" <<EOF
#!/bin/sh
# rsh agent of the emulated cluster '$P' (generated by benchmarks/cluster.sh up)
while [ \$# -gt 0 ]; do case "\$1" in -*) shift;; *) break;; esac; done
host=\$1; shift
line=\$(awk -v h="\$host" '\$1 == h || \$2 == h' "$STATE/hosts")
[ -n "\$line" ] || { echo "cluster agent: unknown host \$host" >&2; exit 255; }
set -- "\$(echo "\$line" | awk '{print \$3}')" "\$(echo "\$line" | awk '{print \$2}')" "\$*"
exec ip netns exec "\$1" unshare --uts sh -c 'hostname "\$0"; exec sh -c "\$1"' "\$2" "\$3"
EOF
    chmod +x "$STATE/agent"
}

cmd_up() {
    local n=${1:-2} rate=${2:-1gbit} delay=${3:-0ms} i ns
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N_HOSTS must be 1..200"
    rate_bytes "$rate" > /dev/null
    if [ -n "$(our_namespaces)" ]; then die "cluster '$P' already exists: run 'down' first"; fi
    mkdir -p "$STATE"
    : > "$STATE/hosts"
    # from here on, a failure leaves a half-built cluster: remove it before reporting
    trap 'log "up failed; removing what was created"; cmd_down >/dev/null 2>&1 || true' ERR
    ip netns add "$P-sw"
    ip -n "$P-sw" link set lo up
    ip -n "$P-sw" link add br0 type bridge
    ip -n "$P-sw" link set br0 up
    for ((i = 0; i < n; i++)); do
        ns="$P-h$i"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip link add "$IFACE" netns "$ns" mtu "$MTU" type veth peer name "h$i" netns "$P-sw" mtu "$MTU"
        ip -n "$P-sw" link set "h$i" master br0
        ip -n "$P-sw" link set "h$i" up
        ip -n "$ns" addr add "$(host_ip "$i")/24" dev "$IFACE"
        ip -n "$ns" link set "$IFACE" up
        echo "$(host_ip "$i") $(host_name "$i") $ns" >> "$STATE/hosts"
    done
    write_agent
    cmd_rate "$rate" "$delay"
    trap - ERR
    log "up: $n hosts ($(awk '{printf "%s=%s ", $2, $1}' "$STATE/hosts")), $rate per link, state $STATE"
}

kill_in_namespace() {  # the processes living in one of our namespaces (all of them ours)
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -z "$pids" ] && return 0
    kill -TERM $pids 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        sleep 0.2
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -z "$pids" ] && return 0
    done
    kill -KILL $pids 2>/dev/null || true
    sleep 0.2
}

cmd_reap() { local ns; for ns in $(our_namespaces); do kill_in_namespace "$ns"; done; }

cmd_down() {
    local ns
    for ns in $(our_namespaces); do kill_in_namespace "$ns"; done
    for ns in $(our_namespaces); do ip netns del "$ns" 2>/dev/null || true; done
    # veth pairs die with their namespaces; refuse to report success if anything is left
    rm -rf "$STATE"
    if [ -n "$(our_namespaces)" ]; then die "down: namespaces left: $(our_namespaces | tr '\n' ' ')"; fi
    log "down: cluster '$P' removed"
}

cmd_status() {
    our_namespaces
    [ -f "$STATE/hosts" ] && cat "$STATE/hosts" "$STATE/shape"
    local ns
    for ns in $(our_namespaces); do tc -n "$ns" qdisc show 2>/dev/null | grep -v noqueue | sed "s/^/$ns: /"; done
}

in_host() {  # index, then the command: run it in host i's namespace under its host name
    local i=$1; shift
    exec ip netns exec "$P-h$i" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$(host_name "$i")" "$@"
}

cmd_exec() {
    [ -f "$STATE/hosts" ] || die "no cluster '$P' (run 'up' first)"
    in_host "$@"
}

cmd_run() {
    local per_host=2 timeout=600 n hosts rc
    while [ $# -gt 0 ]; do
        case "$1" in
            --per-host) per_host=$2; shift 2;;
            --timeout) timeout=$2; shift 2;;
            --) shift; break;;
            *) break;;
        esac
    done
    [ $# -gt 0 ] || die "run: nothing to run"
    [ -f "$STATE/hosts" ] || die "no cluster '$P' (run 'up' first)"
    n=$(wc -l < "$STATE/hosts")
    hosts=$(awk -v k="$per_host" '{printf "%s%s:%d", (NR > 1 ? "," : ""), $1, k}' "$STATE/hosts")
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export HVDC_CLUSTER_IFACE=$IFACE HVDC_CLUSTER_STATE=$STATE
    set +e
    timeout -k 15 "$timeout" ip netns exec "$P-h0" unshare --uts sh -c 'hostname "$0"; exec "$@"' \
        "$(host_name 0)" \
        mpirun -np $((n * per_host)) -H "$hosts" --oversubscribe --bind-to none \
        --mca plm_rsh_agent "$STATE/agent" \
        --mca btl self,vader,tcp --mca btl_tcp_if_include "$IFACE" --mca oob_tcp_if_include "$IFACE" \
        -x OMPI_MCA_mpi_yield_when_idle -x OMPI_MCA_btl_vader_single_copy_mechanism \
        -x OMP_NUM_THREADS -x MKL_NUM_THREADS -x TF_CPP_MIN_LOG_LEVEL -x PYTHONUNBUFFERED \
        -x PYTHONPATH -x HVDC_CLUSTER_IFACE -x HVDC_CLUSTER_STATE \
        "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then log "run: job killed after ${timeout}s"; fi
    # a failed or killed job can leave daemons/ranks behind in the host namespaces: reap them
    if [ "$rc" -ne 0 ]; then cmd_reap; fi
    return "$rc"
}

case "${1:-}" in
    up) shift; cmd_up "$@";;
    rate) shift; cmd_rate "$@";;
    run) shift; cmd_run "$@";;
    exec) shift; cmd_exec "$@";;
    status) shift; cmd_status;;
    reap) shift; cmd_reap;;
    down) shift; cmd_down;;
    *) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2;;
esac
