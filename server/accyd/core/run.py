"""The one-call path: upload, launch, wait, download, written over the facade's operations."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from accyd.catalog.dtypes import Scalar
from accyd.catalog.model import ArtifactFormat
from accyd.core.arguments import Tensor, check_tensors
from accyd.core.interface import Core
from accyd.core.sessions import order_scalars
from accyd.core.tenants import DEFAULT_TENANT, Quotas
from accyd.errors import NotFound

__all__ = ["run"]


def run(
    core: Core,
    client_id: str | None,
    target: str,
    version: int,
    format: ArtifactFormat | None,
    operands: Sequence[Tensor],
    scalars: Mapping[str, Scalar],
    *,
    tenant: str = DEFAULT_TENANT,
    quotas: Quotas | None = None,
) -> list[Tensor]:
    """*Blocking*: run ``target`` once on inline operands; its results, inline.

    A caller that did not attach gets a client of its own for the call, of its
    ``tenant`` and under its ``quotas``, so the one-call path bypasses no quota.
    Everything is refused before anything is allocated, as ``Launch`` would.
    """
    owner = core.attach("run", tenant, quotas).id if client_id is None else client_id
    try:
        loaded = core.load_pipeline(owner, target, version, format)
        pipeline = loaded.pipeline
        check_tensors(pipeline, operands)
        args = order_scalars(pipeline, scalars)
        pipeline.validate_runtime_scalars(args)
        for index, (spec, tensor) in enumerate(zip(pipeline.operands, operands, strict=True)):
            spec.check_holds(
                len(tensor.data), spec.byte_size(args), "operand", index, pipeline, args
            )
        sizes = [spec.byte_size(args) for spec in pipeline.results]
        made: list[str] = []
        try:
            for spec, tensor in zip(pipeline.operands, operands, strict=True):
                made.append(core.allocate_buffer(owner, len(tensor.data), spec.dtype).id)
                with core.open_write(owner, made[-1]) as transfer:
                    transfer.write(0, tensor.data)
            for spec, size in zip(pipeline.results, sizes, strict=True):
                made.append(core.allocate_buffer(owner, size, spec.dtype).id)
            count = len(operands)
            ticket = core.launch(
                owner, loaded.session_id, made[:count], made[count:], scalars, may_block=True
            )
            core.wait_launch(owner, loaded.session_id, ticket.launch_id)
            outputs = zip(pipeline.results, made[count:], sizes, strict=True)
            return [
                Tensor(spec.name, spec.dtype, core.open_read(owner, buffer_id).read(0, size))
                for spec, buffer_id, size in outputs
            ]
        finally:
            for buffer_id in made:
                with contextlib.suppress(NotFound):
                    core.free_buffer(owner, buffer_id)
    finally:
        if client_id is None:
            core.detach(owner)
