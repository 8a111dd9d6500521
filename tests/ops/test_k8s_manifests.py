"""The shipped Kubernetes manifests, loaded into the Kubernetes client's own models: a field the
API does not know (a typo, a wrong nesting) is dropped by the model, so the round trip differs
from the file and the test names it. And the server's role grants what the drain calls."""

import json
from pathlib import Path

import pytest
import yaml

kubernetes = pytest.importorskip("kubernetes")

DEPLOY = Path(__file__).resolve().parents[2] / "agents" / "deploy"
MANIFESTS = ("daemonset.yaml", "kubernetes-server-rbac.yaml")


class _Response:
    def __init__(self, body: dict):
        self.data = json.dumps(body)


def as_model(doc: dict):
    """The client's model for a manifest document: V1DaemonSet for apps/v1 DaemonSet."""
    version = doc["apiVersion"].rpartition("/")[2]
    api = kubernetes.client.ApiClient()
    return api, api.deserialize(_Response(doc), f"{version.capitalize()}{doc['kind']}")


def documents():
    for name in MANIFESTS:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc:
                yield name, doc


@pytest.mark.parametrize(
    "name,doc", list(documents()), ids=[f"{n}:{d['kind']}" for n, d in documents()]
)
def test_every_manifest_field_is_one_the_api_knows(name, doc):
    api, model = as_model(doc)
    assert type(model).__name__.endswith(doc["kind"])
    assert api.sanitize_for_serialization(model) == doc


def test_the_server_role_grants_exactly_what_the_drain_calls():
    # KubernetesAdapter: read_node (get nodes), patch_node (cordon, taint: patch nodes),
    # patch_node_status (the FleetwatchUnhealthy condition: patch nodes/status).
    needed = {("nodes", "get"), ("nodes", "patch"), ("nodes/status", "patch")}
    [role] = [d for _, d in documents() if d["kind"] == "ClusterRole"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == needed
    [binding] = [d for _, d in documents() if d["kind"] == "ClusterRoleBinding"]
    [account] = [d for _, d in documents() if d["kind"] == "ServiceAccount"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
