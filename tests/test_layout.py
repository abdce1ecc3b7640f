"""The code's shape, as docs/architecture.md promises it: every daemon import allowed by the
map's table of layers (read from the page itself), no import circle, grpc only in the doors,
the client's API objects above its transports, and long modules named."""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"accyd": ROOT / "server" / "accyd", "accy": ROOT / "client" / "accy"}
MAP = ROOT / "docs" / "architecture.md"
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


def imported(name: str, path: Path, *, typing: bool = False) -> set[str]:
    """Everything ``name`` may import, a function's own imports too (a circle broken by a
    late import is still a circle); what is only under TYPE_CHECKING with ``typing``."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in tree.body:
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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


def graph(package: str, *, typing: bool = False) -> dict[str, set[str]]:
    """Each module's imports of modules of its own package."""
    known = modules(package)
    return {
        name: {
            other
            for other in imported(name, path, typing=typing)
            if other in known and other != name
        }
        for name, path in known.items()
    }


@dataclass(frozen=True)
class Layer:
    """One row of the map's table: its modules (each with what lies under it) and the layers
    its modules may import besides their own."""

    name: str
    modules: tuple[str, ...]
    may_import: frozenset[str]


def layers() -> list[Layer]:
    """The table under architecture.md's "Layers" heading, top row first."""
    text = MAP.read_text().split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header[:3] == ["layer", "modules", "may import"], f"the map's table changed: {header}"
    found = []
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        found.append(
            Layer(
                name=cells[0],
                modules=tuple(re.findall(r"`(accyd(?:\.\w+)*)`", cells[1])),
                may_import=frozenset(re.findall(r"\w+", cells[2])),
            )
        )
    return found


def layer_of(module: str, table: list[Layer]) -> Layer | None:
    """The row naming ``module`` or the nearest package above it (``accyd`` names only the
    package's own ``__init__``, so that a module the map forgot is not placed silently)."""
    best: tuple[int, Layer] | None = None
    for layer in table:
        for entry in layer.modules:
            covers = module == entry or (entry != "accyd" and module.startswith(f"{entry}."))
            if covers and (best is None or len(entry) > best[0]):
                best = (len(entry), layer)
    return best[1] if best else None


def test_the_maps_layers_point_down() -> None:
    """Each row may import only rows below it, and names modules that exist, once."""
    table = layers()
    names = [layer.name for layer in table]
    known = modules("accyd")
    assert len(table) > 5 and len(set(names)) == len(names), f"the map's layers: {names}"
    for index, layer in enumerate(table):
        below = set(names[index + 1 :])
        assert layer.may_import <= below, (
            f"layer {layer.name} may import {sorted(layer.may_import - below)}, "
            "which are not below it in the map"
        )
    entries = [entry for layer in table for entry in layer.modules]
    assert len(set(entries)) == len(entries), f"named twice in the map: {entries}"
    missing = [entry for entry in entries if entry not in known]
    assert not missing, f"the map names no such module: {missing}"


def test_every_import_follows_the_map() -> None:
    """Every import in the daemon (a function's own and a type checker's too) stays in its
    layer or goes to one its row names."""
    table = layers()
    unplaced = sorted(name for name in modules("accyd") if layer_of(name, table) is None)
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"
    wrong = []
    for name, imports in sorted(graph("accyd", typing=True).items()):
        here = layer_of(name, table)
        assert here is not None
        for other in sorted(imports):
            there = layer_of(other, table)
            assert there is not None
            if there.name != here.name and there.name not in here.may_import:
                allowed = ", ".join(sorted(here.may_import)) or "only its own modules"
                wrong.append(
                    f"{name} ({here.name}) imports {other} ({there.name}): "
                    f"{here.name} may import {allowed}"
                )
    assert not wrong, "imports against docs/architecture.md's layers:\n" + "\n".join(wrong)


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
