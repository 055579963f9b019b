#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for the end-to-end Slurm test (tests/e2e/slurm) and for
# trying the examples in examples/slurm/ without a real cluster. Debian 12 packages (slurmd,
# slurmctld, munge; Slurm 22.05), daemons started directly (no systemd), everything as root.
#
#   scripts/slurm-setup.sh start   # install if missing, configure, start; wait until the node is idle
#   scripts/slurm-setup.sh stop    # stop the daemons this script started (pid files under $DIR)
#   scripts/slurm-setup.sh status  # exit 0 when this script's slurmctld and slurmd are running
#   scripts/slurm-setup.sh env     # print `export SLURM_CONF=...` for the client commands
#
# Idempotent: `start` on a running cluster only checks that it answers. The configuration lives in
# its own folder ($MQA_SLURM_DIR, default /var/tmp/mqa-slurm), never in /etc/slurm: client commands
# need SLURM_CONF=$DIR/slurm.conf (`env` prints it). Choices, and why:
#   - SlurmUser/SlurmdUser root: CI runs as root and the daemons are not installed as services.
#   - ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no cgroup or systemd set-up needed;
#     linuxproc still finds every process of a job by parent pid, so scancel reaches all ranks.
#   - MpiDefault=pmix (Debian builds mpi_pmix_v4 against libpmix2 4.2, the same PMIx that
#     Debian's Open MPI 4.1 uses, so `srun` direct launch wires MPI ranks); pmi2 is also built
#     but Open MPI 4.1 has no PMI-2 client (its s1/s2 components were removed), so it is pmix.
#   - No slurmdbd: job records come from `scontrol show job` (kept MinJobAge seconds after the
#     end) and from jobcomp/filetxt ($DIR/jobcomp.log, one line per finished job with its state).
#   - The node's CPUs and memory come from `slurmd -C`, so the node never drains for a mismatch.
set -euo pipefail

DIR=${MQA_SLURM_DIR:-/var/tmp/mqa-slurm}
CONF=$DIR/slurm.conf
NODE=$(hostname -s)

log() { echo "slurm-setup: $*" >&2; }

alive() {  # alive PIDFILE: the pid in the file is a running process (not a zombie: where pid 1
           # does not reap orphans, a killed daemon stays a zombie that `kill -0` still finds)
  [[ -f "$1" ]] || return 1
  local pid state
  pid=$(cat "$1")
  kill -0 "$pid" 2>/dev/null || return 1
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
  [[ -n "$state" && "$state" != Z ]]
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
     && command -v sbatch >/dev/null; then
    return
  fi
  log "installing slurmd slurmctld slurm-client munge (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null
}

write_config() {
  mkdir -p "$DIR/spool/ctld" "$DIR/spool/d" "$DIR/log"
  # NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=N
  local hw
  hw=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //')
  local new="$DIR/slurm.conf.new"
  cat >"$new" <<EOF
# Written by scripts/slurm-setup.sh: a one-node test cluster on $NODE (localhost).
ClusterName=mqa-ci
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/d
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
# Ranks get SIGTERM first (graceful drain), SIGKILL this many seconds later.
KillWait=10
# Finished jobs stay visible to scontrol this long (no slurmdbd for sacct).
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
NodeName=$NODE NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  if [[ -f "$CONF" ]] && cmp -s "$new" "$CONF"; then
    rm -f "$new"
    return 1  # unchanged
  fi
  mv "$new" "$CONF"
  return 0
}

# munged at its default socket (/run/munge), which Slurm's auth/munge and cred/munge use.
MUNGE_PID=/run/munge/munged.pid
start_munge() {
  if alive "$MUNGE_PID"; then return; fi
  if [[ -S /run/munge/munge.socket.2 ]] && munge -n </dev/null >/dev/null 2>&1; then
    return  # a munged that this script did not start (a system one) already answers
  fi
  log "starting munged"
  # The key comes with Debian's munge package; make one if it is missing.
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge
  chown munge:munge /run/munge
  chmod 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
}

stop_all() {
  local f
  for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$MUNGE_PID"; do
    if alive "$f"; then
      local pid
      pid=$(cat "$f")
      log "stopping $(basename "$f" .pid) (pid $pid)"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do alive "$f" || break; sleep 0.2; done
      if alive "$f"; then kill -9 "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$f"
  done
}

wait_idle() {
  local state=""
  for _ in $(seq 120); do
    state=$(SLURM_CONF=$CONF sinfo -h -n "$NODE" -o '%T' 2>/dev/null || true)
    case "$state" in
      idle|mixed|allocated) log "node $NODE is $state"; return 0 ;;
      *drain*|*down*|*fail*)
        # A node left down by an earlier run (ReturnToService=2 returns it once it registers).
        SLURM_CONF=$CONF scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  log "node $NODE did not become idle (state '$state'); logs in $DIR/log"
  tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
  return 1
}

start_all() {
  install_packages
  local changed=0
  if write_config; then changed=1; fi
  if [[ $changed == 1 ]] && { alive "$DIR/slurmctld.pid" || alive "$DIR/slurmd.pid"; }; then
    log "configuration changed: restarting the daemons"
    stop_all
  fi
  start_munge
  if ! alive "$DIR/slurmctld.pid"; then
    log "starting slurmctld"
    # -i: ignore state files from an earlier configuration; the cluster holds no jobs across runs.
    slurmctld -f "$CONF" -i
  fi
  if ! alive "$DIR/slurmd.pid"; then
    log "starting slurmd"
    slurmd -f "$CONF" -N "$NODE"
  fi
  wait_idle
}

case "${1:-start}" in
  start) start_all ;;
  stop) stop_all ;;
  status) alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 [start|stop|status|env]" >&2; exit 2 ;;
esac
