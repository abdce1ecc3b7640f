"""The daemon's current catalog, replaced whole while clients work (SIGHUP, ReloadCatalog).

A replacement is checked before it is taken: every kernel of a format a device's backend
loads is compiled (CUDA C++ through the compile cache, so a later load finds it) or taken
(cubins, Triton's, host code), and the first that fails refuses the whole catalog, naming
its file and kernel; the old catalog stays. Sessions hold the pipeline and registry they
were loaded with, so a replaced or removed pipeline runs on for its sessions until they
are released; new loads see the new catalog. ``generation`` counts replacements: a door
that keeps what it found in the catalog (the KServe door's models) drops it when the
generation moves, its one invalidation rule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from accyd.backends.base import Backend
from accyd.catalog.catalog import Catalog
from accyd.catalog.model import Pipeline, Registry
from accyd.clipping import clip
from accyd.core.executor import artifact_request
from accyd.core.holdings import CatalogView
from accyd.errors import AccyError, CatalogError, FailedPrecondition, NotFound

__all__ = ["CatalogChange", "Catalogs", "check_kernels"]

log = structlog.get_logger("accyd.core")


@dataclass(frozen=True, slots=True)
class CatalogChange:
    """What a replacement changed, as ``target vN`` names."""

    added: tuple[str, ...]
    replaced: tuple[str, ...]
    removed: tuple[str, ...]
    generation: int


def check_kernels(backends: Iterable[Backend], registry: Registry) -> int:
    """*Blocking*: make every kernel a backend loads; ``CatalogError`` for the first that
    fails (its message names the kernel, its file, and the compiler's words). Returns how
    many were made."""
    made = 0
    seen: set[str] = set()
    for backend in backends:
        if backend.kind.value in seen:  # one backend of a kind compiles for all its devices
            continue
        seen.add(backend.kind.value)
        for entry in registry.entries:
            if entry.format not in backend.formats:
                continue
            try:
                backend.create_artifact(artifact_request(entry)).close()
            except AccyError as error:
                raise CatalogError(
                    f"{entry.origin}: kernel {entry.target} v{entry.version} "
                    f"({entry.format.value}) cannot be made: {error.message}",
                    field="kernel",
                ) from error
            made += 1
    return made


class Catalogs:
    """The current catalog and its generation; replaced under the daemon's lock, one
    replacement at a time. ``source`` reads the catalog again (the operator's folders)."""

    def __init__(
        self,
        catalog: CatalogView,
        lock: threading.RLock,
        source: Callable[[], CatalogView] | None = None,
    ) -> None:
        self.current = catalog
        self.generation = 0
        self._lock = lock
        self._source = source
        self._replacing = threading.Lock()

    def reload(self, backends: Iterable[Backend]) -> CatalogChange:
        """*Blocking*: read the catalog again from its source and serve it (``replace``)."""
        if self._source is None:
            raise FailedPrecondition("this daemon's catalog was given, not read: nothing to reload")
        with self._replacing:
            try:
                return self._replace(self._source(), backends)
            except CatalogError as error:  # the operator's files, not the caller's request
                raise FailedPrecondition(
                    f"catalog not reloaded, the old one stays: {error.message}"
                ) from error

    def without(self, target: str, backends: Iterable[Backend]) -> CatalogChange:
        """*Blocking*: serve the current catalog less every version of ``target`` (until a
        reload reads it again); ``NotFound`` if it serves none."""
        with self._replacing:
            current = self.current
            kept = [p for p in current.pipelines if p.target != target]
            if len(kept) == len(current.pipelines):
                raise NotFound(f"no pipeline {clip(target)!r} to remove", field="name")
            return self._replace(Catalog(current.registry, kept), backends)

    def replace(self, catalog: CatalogView, backends: Iterable[Backend]) -> CatalogChange:
        """*Blocking*: check ``catalog``'s kernels, then serve it; what changed."""
        with self._replacing:
            return self._replace(catalog, backends)

    def _replace(self, catalog: CatalogView, backends: Iterable[Backend]) -> CatalogChange:
        check_kernels(backends, catalog.registry)
        with self._lock:
            old, self.current = self.current, catalog
            self.generation += 1
            generation = self.generation
        change = _difference(old, catalog, generation)
        log.info(
            "catalog replaced",
            generation=generation,
            added=len(change.added),
            replaced=len(change.replaced),
            removed=len(change.removed),
            pipelines=len(catalog.pipelines),
        )
        return change


def _difference(old: CatalogView, new: CatalogView, generation: int) -> CatalogChange:
    """Pipelines added, removed, and replaced: changed themselves, or one of their
    stages' kernels changed."""
    before = {(p.target, p.version): p for p in old.pipelines}
    after = {(p.target, p.version): p for p in new.pipelines}

    def kernels(catalog: CatalogView, pipeline: Pipeline) -> list[object]:
        return [
            catalog.registry.find(stage.target, stage.version, fmt)
            for stage in pipeline.stages
            for fmt in catalog.formats_of(pipeline)
        ]

    def named(keys: Iterable[tuple[str, int]]) -> tuple[str, ...]:
        return tuple(sorted(f"{target} v{version}" for target, version in keys))

    replaced = [
        key
        for key in after.keys() & before.keys()
        if after[key] != before[key] or kernels(new, after[key]) != kernels(old, before[key])
    ]
    return CatalogChange(
        named(after.keys() - before.keys()),
        named(replaced),
        named(before.keys() - after.keys()),
        generation,
    )
