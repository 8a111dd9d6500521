#!/bin/sh
# Slurm HealthCheckProgram (slurm.conf: HealthCheckProgram=/etc/fleetwatch/slurm-healthcheck.sh,
# HealthCheckInterval=300). Slurm runs it with no arguments, no PATH and ignores its exit code:
# the check itself drains the node through scontrol (reason "fleetwatch: ..."), resumes only a
# node it drained, and fails open when Fleetwatch cannot be asked. Bounded: slurmd waits for it.
# FLEETWATCH_AGENT / FLEETWATCH_AGENT_CONFIG override the agent's path and configuration;
# scontrol and sinfo are looked up on the PATH given here (Slurm's usual prefixes).
PATH="${FLEETWATCH_SLURM_PATH:-/usr/bin:/usr/local/bin:/opt/slurm/bin}"
export PATH
agent="${FLEETWATCH_AGENT:-/usr/local/bin/fleetwatch-agent}"
config="${FLEETWATCH_AGENT_CONFIG:-/etc/fleetwatch/agent.toml}"
if [ -x /usr/bin/timeout ]; then
  /usr/bin/timeout "${FLEETWATCH_CHECK_TIMEOUT:-60}" "$agent" --config "$config" check --drain
else
  "$agent" --config "$config" check --drain
fi
exit 0
