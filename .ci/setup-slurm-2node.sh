#!/usr/bin/env bash
# A real TWO-node Slurm cluster on this host for the slurm launcher's multi-node tests
# (tests/launchers/test_slurm_two_nodes.py): one slurmctld (here, on the bridge address) and two slurmd, each in its
# own Linux network namespace (veth pair into a private bridge) and its own UTS namespace, so each node has its own
# host name and address; both see this host's file system (output_dir is shared, as on a real cluster's NFS/Lustre).
#
#   mclbr0 10.77.0.1 (this host: slurmctld, the flow, sbatch)
#     ├─ mcl-node1 10.77.0.11  (netns mcl-node1, hostname mcl-node1, slurmd -N mcl-node1)
#     └─ mcl-node2 10.77.0.12  (netns mcl-node2, hostname mcl-node2, slurmd -N mcl-node2)
#
# It is a cluster of its own (ClusterName mclpipe-2node, partition `pair`, ports 6827/6828, config in
# /etc/slurm-2node), beside the one-node cluster of .ci/setup-slurm.sh, which it leaves alone: clients reach it with
#   export SLURM_CONF=/etc/slurm-2node/slurm.conf   (then: sinfo; srun -N2 hostname)
# Names resolve through /etc/hosts lines this script adds (marked `# mclpipe-2node`).
# Idempotent: installs what is missing (through .ci/setup-slurm.sh, which also starts munged), rewrites the config,
# (re)starts only what is not answering. `.ci/setup-slurm-2node.sh down` stops both nodes, the controller, the
# namespaces, the bridge and the /etc/hosts lines. Needs root.
set -euo pipefail
. "$(dirname "$0")/slurm-common.sh"

if [ "$(id -u)" != 0 ]; then
  echo "setup-slurm-2node: must run as root (it creates network namespaces and starts slurmctld and slurmd)" >&2
  exit 1
fi

CONF_DIR=/etc/slurm-2node
CONF="$CONF_DIR/slurm.conf"
STATE=/var/spool/slurmctld-2node
LOGS=/var/log/slurm
BRIDGE=mclbr0
NET=10.77.0
CTL_ADDR="$NET.1"
NODES=(mcl-node1 mcl-node2)
ADDRS=("$NET.11" "$NET.12")
CTL_PID=/run/slurmctld-2node.pid
MARK="# mclpipe-2node"
export SLURM_CONF="$CONF"

pid_alive() { local pid; pid=$(cat "$1" 2>/dev/null || true); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

stop_pidfile() {  # stop the daemon of a pid file and wait until it is gone
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$1"
}

node_down() {  # stop one node: its slurmd, then every process left in its namespace (job steps), then the netns
  local node=$1 pids
  stop_pidfile "/run/slurmd-$node.pid"
  if [ -e "/run/netns/$node" ]; then
    pids=$(ip netns pids "$node" 2>/dev/null || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns del "$node"
  fi
  ip link del "veth-$node" 2>/dev/null || true
}

hosts_lines() {
  echo "$CTL_ADDR $(hostname -s)-mclbr $MARK"
  for i in "${!NODES[@]}"; do echo "${ADDRS[$i]} ${NODES[$i]} $MARK"; done
}

write_hosts() {  # $1: with (add our lines) or without; /etc/hosts may be a bind mount: rewrite it in place
  local kept
  kept=$(grep -v -F "$MARK" /etc/hosts || true)
  { printf '%s\n' "$kept"; [ "$1" = without ] || hosts_lines; } > /etc/hosts.mclpipe.tmp
  cat /etc/hosts.mclpipe.tmp > /etc/hosts
  rm -f /etc/hosts.mclpipe.tmp
}

if [ "${1:-up}" = down ]; then
  for node in "${NODES[@]}"; do node_down "$node"; done
  stop_pidfile "$CTL_PID"
  ip link del "$BRIDGE" 2>/dev/null || true
  while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do :; done
  write_hosts without
  echo "setup-slurm-2node: the two-node cluster is down"
  exit 0
fi

# packages and munged (one key for every daemon): the one-node script installs and starts them
if ! command -v slurmd >/dev/null || ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  # the one-node cluster reads its own config: a SLURM_CONF of the caller (the two-node one) would make its slurmd
  # look for a node name of the two-node config and stop
  env -u SLURM_CONF bash "$(dirname "$0")/setup-slurm.sh"
fi
mkdir -p "$CONF_DIR" "$STATE" "$LOGS"

# the network: a bridge on this host, one namespace per node with a veth pair into the bridge
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link add "$BRIDGE" type bridge
fi
ip addr replace "$CTL_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
# node-to-node traffic crosses the bridge; with br_netfilter loaded (Docker) it meets iptables' FORWARD chain,
# whose policy may be DROP: accept what stays on our bridge (a per-bridge nf_call_iptables 0 cannot override that)
if command -v iptables >/dev/null && [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ]; then
  iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null \
    || iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
fi
for i in "${!NODES[@]}"; do
  node=${NODES[$i]}
  [ -e "/run/netns/$node" ] || ip netns add "$node"
  if ! ip -n "$node" link show eth0 >/dev/null 2>&1; then
    ip link del "veth-$node" 2>/dev/null || true
    ip link add "veth-$node" type veth peer name eth0 netns "$node"
  fi
  ip link set "veth-$node" master "$BRIDGE" up
  ip -n "$node" addr replace "${ADDRS[$i]}/24" dev eth0
  ip -n "$node" link set lo up
  ip -n "$node" link set eth0 up
done
write_hosts with

# one config for the controller and both nodes. The node's %n in the paths: two slurmd on one file system
NEW_CONF=$(cat <<EOF
# written by .ci/setup-slurm-2node.sh (two-node test cluster, nodes in network namespaces)
ClusterName=mclpipe-2node
SlurmctldHost=$(hostname -s)($CTL_ADDR)
SlurmctldPort=6827
SlurmdPort=6828
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}
SlurmdSpoolDir=/var/spool/slurmd-%n
SlurmctldPidFile=${CTL_PID}
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=${LOGS}/slurmctld-2node.log
SlurmdLogFile=${LOGS}/slurmd-%n.log
# SlurmdTimeout 10: a node whose slurmd stops answering is DOWN after 10 s (the lost-node test waits for no more)
$(slurm_conf_common 10)
NodeName=${NODES[0]} NodeAddr=${ADDRS[0]} CPUs=2 State=UNKNOWN
NodeName=${NODES[1]} NodeAddr=${ADDRS[1]} CPUs=2 State=UNKNOWN
PartitionName=pair Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
CHANGED=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$NEW_CONF" ]; then
  printf '%s\n' "$NEW_CONF" > "$CONF"
  CHANGED=1
fi
NEW_CGROUP='# written by .ci/setup-slurm-2node.sh
CgroupPlugin=autodetect
CgroupAutomount=yes'
if [ ! -f "$CONF_DIR/cgroup.conf" ] || [ "$(cat "$CONF_DIR/cgroup.conf")" != "$NEW_CGROUP" ]; then
  printf '%s\n' "$NEW_CGROUP" > "$CONF_DIR/cgroup.conf"
  CHANGED=1
fi
if [ "$CHANGED" = 1 ]; then
  stop_pidfile "$CTL_PID"
  for node in "${NODES[@]}"; do stop_pidfile "/run/slurmd-$node.pid"; done
fi

pid_alive "$CTL_PID" || /usr/sbin/slurmctld -f "$CONF" \
  || { echo "setup-slurm-2node: slurmctld failed; see $LOGS/slurmctld-2node.log" >&2; exit 1; }
for node in "${NODES[@]}"; do
  pid_alive "/run/slurmd-$node.pid" && continue
  # nsenter (not `ip netns exec`, which remounts /sys and so hides the cgroup tree slurmd reads); unshare --uts
  # gives the node its own host name, which `hostname` in its jobs prints
  nsenter --net="/run/netns/$node" unshare --uts /bin/sh -c \
    "hostname $node && exec /usr/sbin/slurmd -f $CONF -N $node" \
    || { echo "setup-slurm-2node: slurmd $node failed; see $LOGS/slurmd-$node.log" >&2; exit 1; }
done

for _ in $(seq 1 40); do
  states=$(timeout 5 sinfo -h -p pair -N -o '%N %T' 2>/dev/null || true)
  idle=$(printf '%s\n' "$states" | grep -c -E ' (idle|mixed|allocated)' || true)
  if [ "$idle" = 2 ]; then
    echo "setup-slurm-2node: nodes ${NODES[*]} are up in partition pair (SLURM_CONF=$CONF)"
    exit 0
  fi
  for node in "${NODES[@]}"; do  # a node brought back after a loss: Slurm keeps it down until told
    if printf '%s\n' "$states" | grep -q -E "^$node (down|drain)"; then
      scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
    fi
  done
  sleep 1
done
echo "setup-slurm-2node: the nodes did not become idle; see $LOGS/slurmctld-2node.log and $LOGS/slurmd-mcl-node*.log" >&2
sinfo -N >&2 || true
exit 1
