#!/usr/bin/env bash
# A real single-node Slurm cluster on this host for the slurm launcher's tests (tests/launchers/test_slurm_real.py):
# munge + slurmctld + slurmd, one `debug` partition, no accounting database (the launcher polls squeue / scontrol).
# Idempotent: installs what is missing, rewrites the config, (re)starts the daemons only when they are not answering.
# Needs root and Debian's packages (apt). Usage: .ci/setup-slurm.sh   (then: sinfo; srun -N1 hostname)
set -euo pipefail
. "$(dirname "$0")/slurm-common.sh"

if [ "$(id -u)" != 0 ]; then
  echo "setup-slurm: must run as root (it installs packages and starts munged, slurmctld and slurmd)" >&2
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq slurm-wlm munge >/dev/null
fi

HOST="$(hostname -s)"
CPUS="${SLURM_TEST_CPUS:-2}"
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOGS=/var/log/slurm
mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOGS" /run/munge /var/lib/munge /var/log/munge /etc/munge

# munge: one key, owned by the munge user (Debian creates it with the package; make one when absent)
if [ ! -s /etc/munge/munge.key ]; then
  if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force; else
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key
chmod 0755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  su -s /bin/sh munge -c "/usr/sbin/munged --force" || /usr/sbin/munged --force
  for _ in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# proctrack/linuxproc and task/none: no cgroup hierarchy to delegate inside a container.
NEW_CONF=$(cat <<EOF
# written by .ci/setup-slurm.sh (single-node test cluster)
ClusterName=mclpipe-ci
SlurmctldHost=${HOST}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}
SlurmdSpoolDir=${SPOOL}
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOGS}/slurmctld.log
SlurmdLogFile=${LOGS}/slurmd.log
$(slurm_conf_common 30)
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
CHANGED=0
if [ ! -f "$CONF_DIR/slurm.conf" ] || [ "$(cat "$CONF_DIR/slurm.conf")" != "$NEW_CONF" ]; then
  printf '%s\n' "$NEW_CONF" > "$CONF_DIR/slurm.conf"
  CHANGED=1
fi
# slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc; autodetect finds this host's hierarchy
NEW_CGROUP='# written by .ci/setup-slurm.sh
CgroupPlugin=autodetect
CgroupAutomount=yes'
if [ ! -f "$CONF_DIR/cgroup.conf" ] || [ "$(cat "$CONF_DIR/cgroup.conf")" != "$NEW_CGROUP" ]; then
  printf '%s\n' "$NEW_CGROUP" > "$CONF_DIR/cgroup.conf"
  CHANGED=1
fi

# by pid file, not by name: the two-node cluster's daemons (.ci/setup-slurm-2node.sh) are slurmctld and slurmd too
running() { local pid; pid=$(cat "/run/$1.pid" 2>/dev/null || true); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }
if [ "$CHANGED" = 1 ]; then
  # a config change needs fresh daemons: stop slurm's own (by the pids in their pid files) and wait until gone
  for pidfile in /run/slurmctld.pid /run/slurmd.pid; do
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
fi
running slurmctld || /usr/sbin/slurmctld || { echo "setup-slurm: slurmctld failed; see $LOGS/slurmctld.log" >&2; exit 1; }
running slurmd || /usr/sbin/slurmd || { echo "setup-slurm: slurmd failed; see $LOGS/slurmd.log" >&2; exit 1; }

for _ in $(seq 1 30); do
  state=$(timeout 5 sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
  case "$state" in
    idle*|mixed*|allocated*) echo "setup-slurm: node $HOST is $state in partition debug"; exit 0 ;;
    down*|drain*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 1
done
echo "setup-slurm: the node did not become idle; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
sinfo >&2 || true
exit 1
