# Sourced by .ci/setup-slurm.sh and .ci/setup-slurm-2node.sh: the slurm.conf lines both test clusters share.
# proctrack/linuxproc and task/none: no cgroup hierarchy to delegate inside a container; no accounting database
# (the launcher polls squeue / scontrol).
slurm_conf_common() {  # $1: SlurmdTimeout, seconds until a silent node is DOWN
  cat <<EOF2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# finished jobs stay visible to squeue / scontrol for 5 minutes (the launcher reads their exit code there)
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=$1
# config_overrides: trust CPUs= below whatever this machine has (CI runners differ), never drain for it
SlurmdParameters=config_overrides
EOF2
}
