"""One inference through the core: inputs in, one launch, outputs out, answered.

The session, scratch and a buffer set come from the client's ``ModelSessions``
(kept between requests). Inputs are written into the set's operand buffers
from the request or from shared-memory regions (``pread``), the pipeline is
launched through the core with every check it makes, its end is polled for a
moment on the event loop, then notified or awaited (``accyd.scheduling``: no
thread waits on the device), and the results are read back into the answer or
written into regions (``pwrite``). Small copies run inline; larger ones on the device-work threads,
within the client's share. The answer has one ``raw_output_contents`` entry
per output, always: an empty one for an output written to shared memory.
"""

from __future__ import annotations

import time

from accyd.core.interface import Core
from accyd.doors.kserve.cuda_regions import CudaRegion, CudaRegions
from accyd.doors.kserve.models import datatype_of
from accyd.doors.kserve.owners import Owner
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.sessions import BufferSet
from accyd.doors.kserve.stats import Phases
from accyd.doors.kserve.tensors import Checked, RegionSlice
from accyd.errors import InvalidRequest
from accyd.scheduling import DeviceWork, LaunchEnd, launched
from accyd.telemetry.metrics import Metrics

__all__ = ["INLINE_BYTES", "Inference"]

INLINE_BYTES = 64 << 10
"""Copies up to this size run on the event loop: a thread hop would cost more."""


class Inference:
    """Runs checked requests for KServe clients."""

    def __init__(
        self,
        daemon: Core,
        work: DeviceWork,
        metrics: Metrics,
        *,
        spin_seconds: float,
        cuda: CudaRegions | None = None,
    ) -> None:
        self.daemon = daemon
        self.cuda = cuda
        self.work = work
        self.metrics = metrics
        self.spin_seconds = spin_seconds

    async def run(
        self, owner: Owner, checked: Checked, request_id: str, phases: Phases
    ) -> pb.ModelInferResponse:
        pipeline = checked.model.pipeline
        models = owner.models
        self._check_regions(owner, checked)
        session = await models.session(
            pipeline.target, pipeline.version, bool(pipeline.intermediates), checked.lowered
        )
        await models.scratch(session, checked.args, [s.name for s in pipeline.runtime_scalars])
        buffers = await models.take(
            session,
            [(i.byte_size, i.spec.dtype) for i in checked.inputs],
            [
                (size, spec.dtype)
                for size, spec in zip(checked.result_sizes, pipeline.results, strict=True)
            ],
        )
        phases.ready = time.perf_counter_ns()
        try:
            response = await self._run(owner, checked, session.session_id, buffers, phases)
        except BaseException:
            models.discard(buffers)
            raise
        models.give(session, buffers)
        response.model_name = checked.model.name
        response.model_version = checked.model.version
        response.id = request_id
        return response

    async def _run(
        self, owner: Owner, checked: Checked, session_id: str, buffers: BufferSet, phases: Phases
    ) -> pb.ModelInferResponse:
        client_id = owner.client_id
        inline = sum(i.byte_size for i in checked.inputs) <= INLINE_BYTES
        if inline:
            self._write_inputs(owner, checked, buffers)
        else:
            await self.work.run_for(client_id, self._write_inputs, owner, checked, buffers)
        phases.written = time.perf_counter_ns()
        await self._launch(client_id, session_id, checked, buffers)
        phases.computed = time.perf_counter_ns()
        outputs = sum(o.byte_size for o in checked.outputs) <= INLINE_BYTES
        if outputs:
            raw = self._read_outputs(owner, checked, buffers)
        else:
            raw = await self.work.run_for(client_id, self._read_outputs, owner, checked, buffers)
        response = pb.ModelInferResponse(
            outputs=[
                pb.ModelInferResponse.InferOutputTensor(
                    name=o.spec.name, datatype=datatype_of(o.spec.dtype), shape=o.shape
                )
                for o in checked.outputs
            ],
            raw_output_contents=raw,
        )
        phases.answered = time.perf_counter_ns()
        return response

    def _check_regions(self, owner: Owner, checked: Checked) -> None:
        """Every region named exists and holds its slice: refused before anything runs."""
        slices = [i.region for i in checked.inputs] + [o.region for o in checked.outputs]
        for where in slices:
            if where is None:
                continue
            cuda = self._cuda_region(owner, where)
            size = cuda.byte_size if cuda is not None else owner.regions.size_of(where.region)
            if where.offset + where.byte_size > size:
                raise InvalidRequest(
                    f"bytes {where.offset}..{where.offset + where.byte_size} are outside region "
                    f"{where.region!r} of {size} bytes",
                    field="parameters.shared_memory_offset",
                )

    def _write_inputs(self, owner: Owner, checked: Checked, buffers: BufferSet) -> None:
        """Copy every input into its operand buffer (from a region where it lies in one)."""
        for item, buffer_id in zip(checked.inputs, buffers.operands, strict=True):
            data = item.data if item.region is None else self._read_region(owner, item.region)
            assert data is not None
            with self.daemon.open_write(owner.client_id, buffer_id) as transfer:
                transfer.write(0, data)

    def _read_region(self, owner: Owner, where: RegionSlice) -> bytes:
        cuda = self._cuda_region(owner, where)
        if cuda is not None and self.cuda is not None:
            return self.cuda.copy(cuda, where.offset, None, where.byte_size)
        with owner.regions.use(where.region) as region:
            return region.read(where.offset, where.byte_size)

    def _write_region(self, owner: Owner, where: RegionSlice, data: bytes) -> None:
        cuda = self._cuda_region(owner, where)
        if cuda is not None and self.cuda is not None:
            self.cuda.copy(cuda, where.offset, bytearray(data), len(data))
            return
        with owner.regions.use(where.region) as region:
            region.write(where.offset, data)

    def _cuda_region(self, owner: Owner, where: RegionSlice) -> CudaRegion | None:
        if self.cuda is None or owner.regions.has(where.region):
            return None
        return self.cuda.find(owner.client_id, where.region)

    def _read_outputs(self, owner: Owner, checked: Checked, buffers: BufferSet) -> list[bytes]:
        """Each output's bytes, or ``b""`` for one written into its region."""
        raw = []
        for output in checked.outputs:
            data = self.daemon.open_read(owner.client_id, buffers.results[output.index]).read(
                0, output.byte_size
            )
            if output.region is None:
                raw.append(data)
                continue
            self._write_region(owner, output.region, data)
            raw.append(b"")
        return raw

    async def _launch(
        self, client_id: str, session_id: str, checked: Checked, buffers: BufferSet
    ) -> None:
        """Launch and wait for the end (``LaunchEnd``: polled briefly, notified, then
        awaited through the core)."""
        started = time.perf_counter()
        pipeline = checked.model.pipeline.target
        try:
            ticket = await launched(
                self.work,
                client_id,
                self.daemon.launch,
                client_id,
                session_id,
                buffers.operands,
                buffers.results,
                checked.scalars,
                watch=True,
            )
            await LaunchEnd(self.daemon, client_id, ticket, self.spin_seconds).wait()
        except Exception as error:
            self.metrics.observe_launch(pipeline, 0.0, waited=True, error=error)
            raise
        self.metrics.observe_launch(pipeline, time.perf_counter() - started, waited=True)
