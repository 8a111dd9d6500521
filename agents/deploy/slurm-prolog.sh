#!/bin/sh
# Slurm prolog (Prolog= in slurm.conf): mark the attempt start on each node of the job.
# SLURM_JOB_ID and SLURM_RESTART_COUNT are in the prolog's environment; fleetwatch-agent derives
# the same job id ("slurm:<id>") and attempt from them as the torch integration does.
# slurmd runs the prolog with no PATH of its own (slurm.conf "Prolog"), so the agent is named by
# its full path: FLEETWATCH_AGENT, else where the systemd unit runs it from.
# Never fail the job because Fleetwatch is away: the report is spooled and sent later, and a
# failure to report is logged to syslog (tag fleetwatch-prolog) instead of vanishing.
agent="${FLEETWATCH_AGENT:-/usr/local/bin/fleetwatch-agent}"
# Bounded (slurmd waits for the prolog/epilog, PrologEpilogTimeout): a hung server or DNS costs
# the job at most this long; the report stays in the spool for the agent to send.
bound=""
[ -x /usr/bin/timeout ] && bound="/usr/bin/timeout ${FLEETWATCH_REPORT_TIMEOUT:-30}"
if ! out=$($bound "$agent" --config "${FLEETWATCH_AGENT_CONFIG:-/etc/fleetwatch/agent.toml}" report-attempt --event start 2>&1); then
  /usr/bin/logger -t fleetwatch-prolog "job ${SLURM_JOB_ID:-?}: start not recorded: $out" 2>/dev/null
fi
exit 0
