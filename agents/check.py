"""``fleetwatch-agent check``: this host's Fleetwatch verdict, for Slurm and NHC, without Django.

Slurm's HealthCheckProgram ignores exit codes: the program must drain the node itself
(slurm.conf), and NHC's checks fail by exiting non-zero. So the check asks the API for the host's
verdict and, with ``--drain``, drains the node through ``scontrol`` with a reason that starts
``fleetwatch:``. It resumes only a node whose drain reason is its own, and never writes over
another's reason: a node an operator or another check drained stays as they left it, and so is
never resumed by Fleetwatch either. When the API cannot be asked (or the agent's configuration
cannot be read) it fails open: exit 0, a line on stderr and in syslog (NHC discards stderr),
nothing changed — a Fleetwatch outage must not drain a cluster.

Exit codes: 0 ok (or Fleetwatch unreachable), 1 watch, 2 drain. The key needs the ``read``
scope (``read_key_file`` in the config, else the agent's own key).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse

import urllib3

REASON_PREFIX = "fleetwatch:"
EXIT = {"ok": 0, "watch": 1, "drain": 2}
SLURM_TIMEOUT_S = 20.0


def warn(message: str) -> None:
    """A failure the operator must be able to find: stderr, and syslog where there is one
    (NHC runs checks with stderr discarded; slurmd keeps no HealthCheckProgram output)."""
    print(f"fleetwatch-agent check: {message}", file=sys.stderr)
    try:
        import syslog
    except ImportError:  # not Unix
        return
    syslog.openlog("fleetwatch-agent", 0, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, f"check: {message}")


def host_verdict(server: str, key: str, host: str, timeout_s: float) -> dict:
    """The API's verdict for ``host``; raises on any failure to get one."""
    url = f"{server.rstrip('/')}/api/v1/hosts/{urllib.parse.quote(host, safe='')}/health"
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"the server must be http:// or https://, not {server!r}")
    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=timeout_s))
    response = http.request("GET", url, headers={"Authorization": f"Bearer {key}"})
    if response.status != 200:
        raise RuntimeError(f"{url} answered {response.status}: {response.data[:200]!r}")
    body = json.loads(response.data)
    if body.get("verdict") not in EXIT:
        raise RuntimeError(f"{url} gave no verdict: {response.data[:200]!r}")
    return body


def _slurm(*args: str) -> str:
    exe = shutil.which(args[0])
    if exe is None:
        raise FileNotFoundError(f"{args[0]} is not on PATH")
    done = subprocess.run(
        [exe, *args[1:]], capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=True
    )
    return done.stdout.strip()


def node_reason(node: str) -> str:
    """The node's current drain/down reason as Slurm holds it ('' when none)."""
    reason = _slurm("sinfo", "--noheader", "--Node", "--nodes", node, "--format", "%E")
    reason = reason.splitlines()[0].strip() if reason else ""
    return "" if reason in ("none", "(null)") else reason


def apply(node: str, verdict: dict, *, drain: bool) -> str:
    """Drain on a drain verdict (reason prefixed ``fleetwatch:``); resume only a node whose
    reason is ours when the verdict no longer says drain. Returns what was done."""
    if not drain:
        return "none"
    reason = node_reason(node)
    if verdict["verdict"] == "drain":
        if reason.startswith(REASON_PREFIX):
            return "already drained by fleetwatch"
        if reason:
            # Someone else's drain (an operator, another check): theirs to lift. Writing our
            # reason over it would make the node ours to resume once the verdict clears.
            return f"left alone: already down for another reason ({reason})"
        why = "; ".join(verdict.get("reasons") or ()) or "host health verdict drain"
        text = f"{REASON_PREFIX} {why}"[:200]
        _slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}")
        return "drained"
    if reason.startswith(REASON_PREFIX):
        _slurm("scontrol", "update", f"NodeName={node}", "State=RESUME")
        return "resumed"
    return "none"
