"""The catalog: pipelines, registry entries and their manifests (pure data and validation)."""

from accyd.catalog.catalog import BUILTIN_CATALOG, Catalog, load_catalog
from accyd.catalog.dtypes import DType, Scalar
from accyd.catalog.model import ArtifactFormat, KernelEntry, Pipeline, Registry

__all__ = [
    "BUILTIN_CATALOG",
    "ArtifactFormat",
    "Catalog",
    "DType",
    "KernelEntry",
    "Pipeline",
    "Registry",
    "Scalar",
    "load_catalog",
]
