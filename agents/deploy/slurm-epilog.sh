#!/bin/sh
# Slurm epilog (Epilog= in slurm.conf): mark the attempt end. The epilog cannot see the job's exit
# code, so it reports "unknown" unless the job state says otherwise; an incident's "failed"
# verdict always outranks it on the server.
# slurmd runs the epilog with no PATH of its own, so the agent is named by its full path
# (FLEETWATCH_AGENT, else the systemd unit's path); a failure to report goes to syslog.
agent="${FLEETWATCH_AGENT:-/usr/local/bin/fleetwatch-agent}"
# Bounded (slurmd waits for the prolog/epilog, PrologEpilogTimeout): a hung server or DNS costs
# the job at most this long; the report stays in the spool for the agent to send.
bound=""
[ -x /usr/bin/timeout ] && bound="/usr/bin/timeout ${FLEETWATCH_REPORT_TIMEOUT:-30}"
status=unknown
case "${SLURM_JOB_EXIT_CODE:-}" in
  0|0:0) status=succeeded ;;
  "") ;;
  *) status=failed ;;
esac
if ! out=$($bound "$agent" --config "${FLEETWATCH_AGENT_CONFIG:-/etc/fleetwatch/agent.toml}" report-attempt --event end --status "$status" 2>&1); then
  /usr/bin/logger -t fleetwatch-epilog "job ${SLURM_JOB_ID:-?}: end not recorded: $out" 2>/dev/null
fi
exit 0
