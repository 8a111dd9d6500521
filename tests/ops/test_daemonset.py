"""The shipped Kubernetes DaemonSet: the agent container can read the node's kernel messages
(/dev/kmsg needs a privileged container: the runtime's device cgroup refuses it otherwise) and
sees the paths the torch integration and the pods write."""

from pathlib import Path

import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "agents" / "deploy" / "daemonset.yaml"


def test_the_agent_container_can_read_kmsg_and_the_pods_logs():
    daemonset = yaml.safe_load(MANIFEST.read_text())
    assert daemonset["kind"] == "DaemonSet"
    pod = daemonset["spec"]["template"]["spec"]
    [agent] = [c for c in pod["containers"] if c["name"] == "agent"]
    assert agent["securityContext"]["privileged"] is True
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["kmsg"]["mountPath"] == "/dev/kmsg" and mounts["kmsg"]["readOnly"]
    assert volumes["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    env = {e["name"]: e for e in agent["env"]}
    for name in ("FLEETWATCH_SPOOL_DIR", "FLEETWATCH_RUN_DIR"):
        assert env[name]["value"].startswith(mounts["fleetwatch"]["mountPath"])
    assert env["FLEETWATCH_LOGS"]["value"].startswith(mounts["pod-logs"]["mountPath"])
