"""The code's shape, as docs/architecture.md promises it: small modules, no import circle,
grpc only in the doors, and the client's API objects above its transports."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"accyd": ROOT / "server" / "accyd", "accy": ROOT / "client" / "accy"}
MAX_LINES = 450


def modules(package: str) -> dict[str, Path]:
    """Every hand-written module of ``package`` by dotted name (generated code left out)."""
    folder = PACKAGES[package]
    found = {}
    for path in sorted(folder.rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")):
            continue
        parts = path.relative_to(folder.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """Everything ``name`` may import, a function's own imports too (a circle broken by a
    late import is still a circle); not what is only under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                names.update(alias.name for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom):
                base = inner.module or ""
                if inner.level:
                    anchor = package.split(".")[: len(package.split(".")) - inner.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in inner.names)
    return names


def graph(package: str) -> dict[str, set[str]]:
    """Each module's imports of modules of its own package."""
    known = modules(package)
    return {
        name: {other for other in imported(name, path) if other in known and other != name}
        for name, path in known.items()
    }


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_long_modules_are_named(package: str) -> None:
    """Modules past the line bound are a place to look, not a failure: a class is split by
    what it holds, never to fit a number (mixins made only to get under it read worse)."""
    long = {
        name: lines
        for name, path in modules(package).items()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    if long:
        warnings.warn(
            f"modules over {MAX_LINES} lines (split by what they hold): {long}", stacklevel=1
        )


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_circle(package: str) -> None:
    edges = graph(package)
    # a package imports its own modules to re-export them; a circle through that is not one
    edges = {
        name: {other for other in imports if not name.startswith(f"{other}.")}
        for name, imports in edges.items()
    }
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for other in sorted(edges[name]):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (circle := visit(other)) is not None:
                return circle
        path.pop()
        state[name] = 2
        return None

    for name in sorted(edges):
        if name not in state and (circle := visit(name)) is not None:
            pytest.fail(f"import circle: {' -> '.join(circle)}")


def test_grpc_is_imported_only_by_the_doors_and_the_server_that_serves_them() -> None:
    doors = ("accyd.doors.grpc", "accyd.doors.kserve")
    importing = {
        name
        for name, path in modules("accyd").items()
        if any(other == "grpc" or other.startswith("grpc.") for other in imported(name, path))
    }
    outside = {name for name in importing if not name.startswith(doors)} - {"accyd.server"}
    assert not outside, f"grpc imported outside the doors: {sorted(outside)}"


def test_aiohttp_is_imported_only_by_the_kserve_http_door() -> None:
    importing = {
        name
        for name, path in modules("accyd").items()
        if any(other == "aiohttp" or other.startswith("aiohttp.") for other in imported(name, path))
    }
    outside = {name for name in importing if not name.startswith("accyd.doors.kserve_http")}
    assert importing and not outside, f"aiohttp imported outside its door: {sorted(outside)}"


def test_the_core_imports_no_door() -> None:
    edges = graph("accyd")
    reaching = {
        name: sorted(other for other in imports if other.startswith("accyd.doors"))
        for name, imports in edges.items()
        if name.startswith(("accyd.core", "accyd.backends"))
    }
    assert not {name: doors for name, doors in reaching.items() if doors}


TRANSPORTS = (
    "_link_transport",
    "_ring",
    "_ring_path",
    "_ring_stream",
    "_unary",
    "_shm",
    "_copying",
)


def test_sessions_buffers_and_launches_import_no_transport() -> None:
    """They speak to the seam (``accy._seam``), never to one way of travelling."""
    edges = graph("accy")
    transports = {f"accy.{name}" for name in TRANSPORTS}
    api = ["accy._sessions", "accy._resources"]  # Session and Launch; Buffer
    assert transports <= set(edges) and set(api) <= set(edges), "modules moved: update here"
    assert {name: sorted(edges[name] & transports) for name in api} == {name: [] for name in api}


def test_api_objects_build_no_protobufs() -> None:
    """``Session``, ``Launch``, ``Buffer`` and ``Client`` hand request values to the link's
    transport and ask the connection's ``Control`` for every other call: none imports the
    wire's messages."""
    known = modules("accy")
    api = ["accy._sessions", "accy._resources", "accy.client"]
    assert set(api) <= set(known), "modules moved: update here"
    wire = {
        name: sorted(n for n in imported(name, known[name]) if n.startswith("accy.protocol.launch"))
        for name in api
    }
    assert wire == {name: [] for name in api}
