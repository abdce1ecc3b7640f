"""Turn a DaemonSet's or Deployment's pod template into a Pod that `podman kube play` runs here.

Used by scripts/container_test.sh, which plays deploy/k8s/daemonset.yaml and
client-deployment.yaml with podman. What changes, and only that: the image (the one CI
built), the GPU (no `nvidia.com/gpu` resource; `--backend` host), the node's host paths
(under a folder of the test), and the Secrets, which podman 4.3 cannot mount: each becomes a
host folder of the same files the test wrote. Init containers run at every start of the pod,
as the kubelet runs them (podman's default, once, races: podman 4.3 removes one that exited
before it looked, as if it were still running, and the play fails). The probes are printed,
one a line (`KIND CONTAINER PORT PERIOD FAILURE_THRESHOLD`): podman runs no gRPC probe, so
the test runs them itself. Needs PyYAML (podman-compose's venv has it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

GPU = "nvidia.com/gpu"
INIT_TYPE = "io.podman.annotations.init.container.type"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _backend(args: list[str], backend: str) -> list[str]:
    """``args`` with every ``--backend`` value replaced by ``backend``."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--backend="):
            arg = f"--backend={backend}"
        elif i and args[i - 1] == "--backend":
            arg = backend
        out.append(arg)
    return out


def _container(spec: dict[str, Any], image: str, backend: str) -> None:
    spec["image"] = image
    spec["imagePullPolicy"] = "Never"
    for kind in ("limits", "requests"):
        spec.get("resources", {}).get(kind, {}).pop(GPU, None)
    for key in ("command", "args"):
        if key in spec:
            spec[key] = _backend(spec[key], backend)


def _volume(volume: dict[str, Any], host_root: Path, secrets: Path) -> None:
    if "hostPath" in volume:
        path = volume["hostPath"]["path"]
        volume["hostPath"]["path"] = str(host_root / path.lstrip("/"))
    elif "secret" in volume:
        name = volume.pop("secret")["secretName"]
        volume["hostPath"] = {"path": str(secrets / name), "type": "Directory"}


def pod(workload: dict[str, Any], image: str, backend: str, host_root: Path, secrets: Path) -> Any:
    """The Pod podman plays for ``workload`` (a DaemonSet or Deployment)."""
    template = workload["spec"]["template"]
    spec = template["spec"]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        _container(container, image, backend)
    for volume in spec.get("volumes", []):
        _volume(volume, host_root, secrets)
    metadata = {"name": workload["metadata"]["name"], **template.get("metadata", {})}
    metadata["annotations"] = {**metadata.get("annotations", {}), INIT_TYPE: "always"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def probes(workload: dict[str, Any]) -> list[str]:
    """One line per probe of the workload's containers: kind, container, port, period, tries."""
    lines = []
    for container in workload["spec"]["template"]["spec"]["containers"]:
        for kind in PROBES:
            probe = container.get(kind)
            if probe is None:
                continue
            if set(probe) & {"exec", "httpGet", "tcpSocket"}:
                sys.exit(f"{container['name']}'s {kind}: only gRPC probes are run by this test")
            lines.append(
                f"{kind} {container['name']} {probe['grpc']['port']} "
                f"{probe.get('periodSeconds', 10)} {probe.get('failureThreshold', 3)}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--image", required=True)
    parser.add_argument("--backend", default="host")
    parser.add_argument("--host-root", type=Path, required=True, help="the node's / for hostPath")
    parser.add_argument("--secrets", type=Path, required=True, help="a folder per Secret")
    parser.add_argument("--out", type=Path, required=True, help="the Pod's YAML")
    args = parser.parse_args()
    workload = yaml.safe_load(args.manifest.read_text())
    made = pod(workload, args.image, args.backend, args.host_root, args.secrets)
    args.out.write_text(yaml.safe_dump(made, sort_keys=False))
    print("\n".join(probes(workload)))


if __name__ == "__main__":
    main()
