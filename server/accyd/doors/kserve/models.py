"""Pipelines as models: names, versions, datatypes, dims, metadata, config and scalars.

A model is a catalog pipeline: its name is the pipeline's target, its versions
the catalog's versions of it (an empty version asks for the newest), its
inputs the operands and its outputs the results, in order. Intermediates never
show. A dimension is the extent where that is a constant and -1 where it is an
expression of runtime scalars; a runtime scalar is a request parameter by
name, listed in the model's config (``scalar.<name>``) so clients can find it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from accyd.catalog.dtypes import DType
from accyd.catalog.expr import Arg, Const
from accyd.catalog.model import BufferSpec, Pipeline
from accyd.clipping import clip
from accyd.doors.kserve.protocol import model_config_pb2 as mc
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.errors import InvalidRequest, NotFound

__all__ = [
    "DATATYPES",
    "PLATFORM",
    "Model",
    "Models",
    "datatype_of",
    "dims_of",
    "dtype_of",
    "parse_version",
]

PLATFORM = "accy"
"""What metadata and config name as the platform of every model."""

DATATYPES: dict[DType, tuple[str, mc.DataType]] = {
    DType.F32: ("FP32", mc.TYPE_FP32),
    DType.F64: ("FP64", mc.TYPE_FP64),
    DType.I32: ("INT32", mc.TYPE_INT32),
    DType.U32: ("UINT32", mc.TYPE_UINT32),
    DType.I64: ("INT64", mc.TYPE_INT64),
    DType.U64: ("UINT64", mc.TYPE_UINT64),
    DType.U8: ("UINT8", mc.TYPE_UINT8),
    DType.F16: ("FP16", mc.TYPE_FP16),
    DType.BF16: ("BF16", mc.TYPE_BF16),
    DType.I8: ("INT8", mc.TYPE_INT8),
    DType.I16: ("INT16", mc.TYPE_INT16),
    DType.U16: ("UINT16", mc.TYPE_UINT16),
    DType.BOOL: ("BOOL", mc.TYPE_BOOL),
    # KServe v2 and Triton's model config have no fp8: these names carry raw bytes.
    DType.F8E4M3: ("FP8_E4M3", mc.TYPE_INVALID),
    DType.F8E5M2: ("FP8_E5M2", mc.TYPE_INVALID),
}
"""Each element type's protocol name and its model-config enum value."""
_BY_NAME = {name: dtype for dtype, (name, _) in DATATYPES.items()}


def datatype_of(dtype: DType) -> str:
    return DATATYPES[dtype][0]


def dtype_of(datatype: str, field: str) -> DType:
    """The element type a protocol datatype names; ``InvalidRequest`` for one accy lacks."""
    dtype = _BY_NAME.get(datatype)
    if dtype is None:
        names = ", ".join(_BY_NAME)
        raise InvalidRequest(
            f"datatype {clip(datatype)!r} is not served; accy's pipelines take {names}",
            field=field,
        )
    return dtype


def dims_of(spec: BufferSpec) -> list[int]:
    """A tensor's dims (its shape, or its extent): each constant one, -1 where it depends
    on runtime scalars."""
    return [d.value if isinstance(d, Const) else -1 for d in spec.shape or (spec.extent,)]


def parse_version(text: str, field: str = "version") -> int:
    """A request's version text as the catalog's version number (0: the newest)."""
    if not text:
        return 0
    if not text.isdigit() or len(text) > 9 or int(text) == 0:
        raise InvalidRequest(
            f"model version {clip(text)!r} is not a version: a positive number, or empty for "
            "the newest",
            field=field,
        )
    return int(text)


@dataclass(frozen=True, slots=True)
class Model:
    """One pipeline seen as a model, with the other versions the catalog has of it."""

    pipeline: Pipeline
    versions: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.pipeline.target

    @property
    def version(self) -> str:
        return str(self.pipeline.version)

    def inferred_from(self) -> dict[int, tuple[int, int | None]]:
        """Runtime scalars a request may leave out: scalar index -> (the operand, and the
        dim of its shape or ``None`` for its element count) it is read from: the first
        operand whose extent, or one of whose dims, is that scalar alone."""
        found: dict[int, tuple[int, int | None]] = {}
        for index, spec in enumerate(self.pipeline.operands):
            for dim, expr in enumerate(spec.shape) if spec.shape else [(None, spec.extent)]:
                if isinstance(expr, Arg) and expr.index not in found:
                    found[expr.index] = (index, dim)
        return found

    def metadata(self) -> pb.ModelMetadataResponse:
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.name,
            versions=[str(v) for v in self.versions],
            platform=PLATFORM,
            inputs=[
                tensor(name=s.name, datatype=datatype_of(s.dtype), shape=dims_of(s))
                for s in self.pipeline.operands
            ],
            outputs=[
                tensor(name=s.name, datatype=datatype_of(s.dtype), shape=dims_of(s))
                for s in self.pipeline.results
            ],
        )

    def config(self, gpu: bool) -> mc.ModelConfig:
        """The model's config: no batch dimension, one instance, the scalars as parameters."""
        pipeline = self.pipeline
        return mc.ModelConfig(
            name=self.name,
            platform=PLATFORM,
            backend=PLATFORM,
            max_batch_size=0,
            input=[
                mc.ModelInput(name=s.name, data_type=DATATYPES[s.dtype][1], dims=dims_of(s))
                for s in pipeline.operands
            ],
            output=[
                mc.ModelOutput(name=s.name, data_type=DATATYPES[s.dtype][1], dims=dims_of(s))
                for s in pipeline.results
            ],
            instance_group=[
                mc.ModelInstanceGroup(
                    name=self.name,
                    count=1,
                    kind=mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU,
                )
            ],
            parameters={
                f"scalar.{spec.name}": mc.ModelParameter(string_value=self._scalar_text(i))
                for i, spec in enumerate(pipeline.runtime_scalars)
            },
            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=False),
        )

    def _scalar_text(self, index: int) -> str:
        """How the config describes runtime scalar ``index``: type, bounds, where it comes from."""
        pipeline = self.pipeline
        spec = pipeline.runtime_scalars[index]
        parts = [spec.dtype.value]
        for bound in pipeline.runtime_scalar_bounds:
            if bound.argument_index == index:
                low = "" if bound.min_value is None else f"{bound.min_value}"
                parts.append(f"{low}..{bound.max_value}")
        source = self.inferred_from().get(index)
        if source is None:
            parts.append("a request parameter")
        else:
            operand, dim = source
            name = pipeline.operands[operand].name
            what = "the element count" if dim is None else f"dim {dim}"
            parts.append(f"a request parameter, else {what} of input {name}")
        return "; ".join(parts)


class Models:
    """The catalog's pipelines as models, indexed once: a lookup costs the same whatever the
    catalog's size (the catalog is the daemon's for life: the door keeps one per catalog)."""

    def __init__(self, pipelines: Sequence[Pipeline]) -> None:
        self.pipelines = tuple(pipelines)
        by_name: dict[str, dict[int, Pipeline]] = {}
        for pipeline in self.pipelines:
            by_name.setdefault(pipeline.target, {})[pipeline.version] = pipeline
        self._by_name = {
            name: (tuple(sorted(versions)), versions) for name, versions in by_name.items()
        }

    def versions(self, name: str) -> tuple[Pipeline, ...]:
        """Every version of model ``name``, oldest first (none for an unknown name)."""
        found = self._by_name.get(name)
        return () if found is None else tuple(found[1][v] for v in found[0])

    def find(self, name: str, version: int) -> Model:
        """The model ``name`` at ``version`` (0: the newest)."""
        found = self._by_name.get(name)
        if found is None:
            raise NotFound(
                f"no model {clip(name)!r}: RepositoryIndex lists the models", field="name"
            )
        versions, pipelines = found
        pipeline = pipelines.get(version or versions[-1])
        if pipeline is None:
            raise NotFound(
                f"model {clip(name)!r} has no version {version}; it has "
                f"{', '.join(map(str, versions))}",
                field="version",
            )
        return Model(pipeline, versions)


def find_model(pipelines: Sequence[Pipeline], name: str, version: int) -> Model:
    """The model ``name`` at ``version`` (0: the newest), from the daemon's pipelines."""
    return Models(pipelines).find(name, version)
