"""The Kubernetes manifests keep accy's pod policy, and the policy refuses those that break it."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
POLICY = Draft202012Validator(
    json.loads((ROOT / "docs" / "schemas" / "accy-k8s-policy.json").read_text())
)

Manifest = dict[str, Any]


def load(name: str) -> Manifest:
    document = yaml.safe_load((ROOT / "deploy" / "k8s" / name).read_text())
    assert isinstance(document, dict)
    return document


def refusals(manifest: Manifest) -> list[str]:
    """Each policy error as 'path: message'."""
    return [
        "/".join(str(part) for part in error.absolute_path) + ": " + error.message
        for error in POLICY.iter_errors(manifest)
    ]


def pod(manifest: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def test_manifests_are_there() -> None:
    kinds = {load(path.name)["kind"] for path in MANIFESTS}
    assert {"DaemonSet", "Deployment", "Service", "ServiceAccount", "Namespace"} <= kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_manifest_keeps_the_policy(path: Path) -> None:
    assert refusals(load(path.name)) == []


def set_privileged(spec: dict[str, Any]) -> None:
    spec["containers"][0]["securityContext"]["privileged"] = True


def set_host_network(spec: dict[str, Any]) -> None:
    spec["hostNetwork"] = True


def set_writable_root(spec: dict[str, Any]) -> None:
    spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = False


def drop_read_only_root(spec: dict[str, Any]) -> None:
    del spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"]


def add_capability(spec: dict[str, Any]) -> None:
    spec["containers"][0]["securityContext"]["capabilities"]["add"] = ["NET_ADMIN"]


def init_adds_sys_admin(spec: dict[str, Any]) -> None:
    spec["initContainers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]


def run_as_root(spec: dict[str, Any]) -> None:
    spec["securityContext"]["runAsNonRoot"] = False


def mount_host_root(spec: dict[str, Any]) -> None:
    spec["volumes"][0]["hostPath"]["path"] = "/"


def escalate(spec: dict[str, Any]) -> None:
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True


BREAKS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "privileged": (set_privileged, "containers/0/securityContext/privileged"),
    "host network": (set_host_network, "hostNetwork"),
    "writable root": (set_writable_root, "containers/0/securityContext/readOnlyRootFilesystem"),
    "no read-only root": (drop_read_only_root, "'readOnlyRootFilesystem' is a required property"),
    "added capability": (add_capability, "containers/0/securityContext/capabilities/add"),
    "init SYS_ADMIN": (init_adds_sys_admin, "initContainers/0/securityContext/capabilities/add"),
    "root": (run_as_root, "securityContext/runAsNonRoot"),
    "host root": (mount_host_root, "volumes/0/hostPath/path"),
    "escalation": (escalate, "containers/0/securityContext/allowPrivilegeEscalation"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_policy_refuses_a_daemonset_that_breaks_it(name: str) -> None:
    breaks, where = BREAKS[name]
    manifest = copy.deepcopy(load("daemonset.yaml"))
    breaks(pod(manifest))
    found = refusals(manifest)
    assert found, f"the policy let a DaemonSet with {name} through"
    assert any(where in refusal for refusal in found), found


def test_policy_refuses_a_bare_pod_on_the_host_network() -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {**pod(load("client-deployment.yaml")), "hostNetwork": True},
    }
    assert any(refusal.startswith("spec/hostNetwork") for refusal in refusals(manifest))


def test_client_reaches_the_daemon_socket_through_group_and_mount_alone() -> None:
    daemon, client = pod(load("daemonset.yaml")), pod(load("client-deployment.yaml"))
    listen = [arg for arg in daemon["containers"][0]["args"] if arg.startswith("--listen=unix:")]
    assert listen == ["--listen=unix:/run/accy/accyd.sock"]
    [socket_volume] = client["volumes"][:1]
    assert socket_volume["hostPath"]["path"] == daemon["volumes"][0]["hostPath"]["path"]
    container = client["containers"][0]
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts[socket_volume["name"]]["mountPath"] == "/run/accy"
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["ACCY_TARGET"] == "unix:/run/accy/accyd.sock"
    groups = client["securityContext"]["supplementalGroups"]
    assert daemon["securityContext"]["runAsGroup"] in groups
    assert "nvidia.com/gpu" not in str(container.get("resources", {}))
    assert "nvidia.com/gpu" in daemon["containers"][0]["resources"]["limits"]
