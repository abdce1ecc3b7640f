"""The catalog: every pipeline and kernel entry the daemon serves, loaded from manifest folders."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from accyd.catalog.manifest import read_manifest
from accyd.catalog.model import ArtifactFormat, KernelEntry, Pipeline, Registry
from accyd.clipping import clip
from accyd.errors import CatalogError, InvalidArtifact, NotFound

__all__ = ["BUILTIN_CATALOG", "Catalog", "load_catalog"]

BUILTIN_CATALOG = Path(str(resources.files("accyd.catalog") / "builtin"))
"""The catalog shipped inside the package: CUDA and host kernels for the built-in pipelines."""


class Catalog:
    """Pipelines by (target, version) plus the registry their stages resolve in.

    Every pipeline is checked against the registry when the catalog is made:
    one that runs in no format, or whose shape is wrong, is a ``CatalogError``.
    """

    def __init__(self, registry: Registry, pipelines: Iterable[Pipeline]) -> None:
        self.registry = registry
        self._pipelines: dict[tuple[str, int], Pipeline] = {}
        self._formats: dict[tuple[str, int], tuple[ArtifactFormat, ...]] = {}
        for pipeline in pipelines:
            key = (pipeline.target, pipeline.version)
            if key in self._pipelines:
                raise CatalogError(
                    f"pipeline {pipeline.target} v{pipeline.version} is defined twice: "
                    f"{self._pipelines[key].origin} and {pipeline.origin}"
                )
            self._pipelines[key] = pipeline
            self._formats[key] = self._check(pipeline)

    def _check(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]:
        formats = []
        for fmt in ArtifactFormat:
            try:
                pipeline.stage_entries(self.registry, fmt)
            except InvalidArtifact:
                continue
            try:
                pipeline.validate(self.registry, fmt)
            except InvalidArtifact as error:
                raise CatalogError(f"{pipeline.origin}: {error}") from None
            formats.append(fmt)
        if not formats:
            stages = ", ".join(f"{s.target} v{s.version}" for s in pipeline.stages)
            raise CatalogError(
                f"{pipeline.origin}: no artifact format has a kernel for every stage ({stages})"
            )
        return tuple(formats)

    @property
    def pipelines(self) -> tuple[Pipeline, ...]:
        return tuple(sorted(self._pipelines.values(), key=lambda p: (p.target, p.version)))

    def find_pipeline(self, target: str, version: int = 0) -> Pipeline:
        """The pipeline ``target`` at ``version``, or its newest version when ``version`` is 0."""
        if version:
            pipeline = self._pipelines.get((target, version))
        else:
            versions = [p for (t, _), p in self._pipelines.items() if t == target]
            pipeline = max(versions, key=lambda p: p.version) if versions else None
        if pipeline is None:
            which = f"{clip(target)} v{version}" if version else clip(target)
            raise NotFound(f"no pipeline {which} in the catalog", field="target")
        return pipeline

    def formats_of(self, pipeline: Pipeline) -> tuple[ArtifactFormat, ...]:
        """The formats in which every stage of ``pipeline`` has a kernel."""
        return self._formats[(pipeline.target, pipeline.version)]


def load_catalog(dirs: Sequence[Path] = (), *, builtin: bool = True) -> Catalog:
    """Load every ``*.toml`` manifest under the built-in catalog (if asked) and ``dirs``."""
    roots = [BUILTIN_CATALOG, *dirs] if builtin else list(dirs)
    kernels: list[KernelEntry] = []
    pipelines: list[Pipeline] = []
    for root in roots:
        if not root.is_dir():
            raise CatalogError(f"{root}: catalog folder does not exist")
        for path in sorted(root.rglob("*.toml")):
            manifest = read_manifest(path)
            kernels.extend(manifest.kernels)
            pipelines.extend(manifest.pipelines)
    try:
        registry = Registry(kernels)
    except InvalidArtifact as error:
        raise CatalogError(str(error)) from None
    return Catalog(registry, pipelines)
