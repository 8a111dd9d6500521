#!/bin/sh
# Slurm prolog (Prolog= in slurm.conf): mark the attempt start on each node of the job.
# SLURM_JOB_ID and SLURM_RESTART_COUNT are in the prolog's environment; fleetwatch-agent derives
# the same job id ("slurm:<id>") and attempt from them as the torch integration does.
# Never fail the job because Fleetwatch is away: the report is spooled and sent later.
fleetwatch-agent --config /etc/fleetwatch/agent.toml report-attempt --event start >/dev/null 2>&1 || true
exit 0
