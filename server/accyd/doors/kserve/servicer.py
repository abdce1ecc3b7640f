"""The KServe v2 / Open Inference Protocol service (``inference.GRPCInferenceService``).

It is registered on the daemon's own gRPC server through the same admission
as the launch service (tokens, TLS, tenants and quotas apply to every call),
and calls the core only through the ``Daemon`` facade. Models are the
catalog's pipelines (``models.py``); each caller is a client of its tenant and
connection (``owners.py``) that owns its sessions, buffers and shared-memory
regions. Errors leave as the launch service's do (``accyd.doors.grpc.status``).
TraceSetting and LogSettings answer UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from pathlib import Path
from typing import TypeVar

import grpc
import structlog

import accyd
from accyd.catalog.model import ArtifactFormat, Pipeline
from accyd.core.interface import Core
from accyd.doors.grpc.admission import current_principal
from accyd.doors.grpc.auth import ADMIN_SCOPE, default_principal
from accyd.doors.grpc.calls import Call, CallTracker, streaming, text_field, unary
from accyd.doors.kserve.cuda_regions import CudaRegions
from accyd.doors.kserve.held import HeldBytes, request_bytes
from accyd.doors.kserve.infer import Inference
from accyd.doors.kserve.memory import SharedMemory
from accyd.doors.kserve.models import Model, Models, parse_version
from accyd.doors.kserve.owners import DEFAULT_LIVENESS_SECONDS, Owner, Owners
from accyd.doors.kserve.peers import parse_peer
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from accyd.doors.kserve.sessions import ModelSessions
from accyd.doors.kserve.stats import Phases, Statistics
from accyd.doors.kserve.streams import STREAM_IN_FLIGHT, Reserve, Streams
from accyd.doors.kserve.tensors import check_request
from accyd.doors.kserve.turns import TenantTurns, Turn
from accyd.errors import InvalidRequest, NotFound, ShuttingDown, UnsupportedOperation
from accyd.settings.config import Config
from accyd.telemetry.metrics import Metrics
from accyd.tokens import Principal

__all__ = ["SERVICE_NAME", "STREAM_IN_FLIGHT", "KServeServicer"]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
MAX_MODELS_KEPT = 4096
"""Models found by (name, version text) kept for the next request (only real ones are)."""
EXTENSIONS = ("model_configuration", "model_repository", "statistics", "system_shared_memory")

log = structlog.get_logger("accyd.doors.kserve")

_T = TypeVar("_T")


class KServeServicer:
    """The RPCs of ``inference.GRPCInferenceService`` over one ``Daemon``."""

    @classmethod
    def from_config(
        cls, daemon: Core, calls: CallTracker, config: Config, metrics: Metrics
    ) -> KServeServicer:
        """The door as ``accyd serve`` runs it, from its flags."""
        return cls(
            daemon,
            calls,
            default_principal=default_principal(config.default_tenant, config.quotas),
            max_message_bytes=config.max_message_bytes - 1024,
            metrics=metrics,
            launch_spin_seconds=config.launch_spin_seconds,
            liveness_seconds=config.kserve_liveness_seconds,
            cuda_gpus=(
                tuple(config.gpu_of(d) for d in config.devices)
                if config.kserve_cuda_shared_memory
                else None
            ),
            memory_bytes=config.kserve_memory_bytes,
            unix_sockets=tuple(
                Path(address.removeprefix("unix:")).expanduser()
                for address in (*config.listen_addresses, *config.kserve_http_listen)
                if address.startswith("unix:")
            ),
        )

    def __init__(
        self,
        daemon: Core,
        calls: CallTracker,
        *,
        default_principal: Principal,
        max_message_bytes: int,
        metrics: Metrics | None = None,
        launch_spin_seconds: float = 0.0,
        liveness_seconds: float = DEFAULT_LIVENESS_SECONDS,
        cuda_gpus: tuple[int, ...] | None = None,
        unix_sockets: tuple[Path, ...] = (),
        memory_bytes: int = 1 << 30,
    ) -> None:
        """``cuda_gpus``: turn CUDA shared memory on, for these GPU ordinals;
        ``unix_sockets``: where the door's callers come in without a name (``Owners``);
        ``memory_bytes``: the most its requests hold at once (``held.py``)."""
        self.daemon = daemon
        self.calls = calls
        self._default = default_principal
        self._max_message = max_message_bytes
        cuda = None if cuda_gpus is None else CudaRegions(cuda_gpus)
        self.owners = Owners(
            daemon,
            lambda client_id: ModelSessions(daemon, calls.work, client_id),
            liveness_seconds=liveness_seconds,
            cuda=cuda,
            unix_sockets=unix_sockets,
        )
        self.memory = SharedMemory(self.owners, calls.work, cuda)
        self.stats = Statistics(None if metrics is None else metrics.triton)
        self.streams = Streams(calls)
        self.turns = TenantTurns()
        self.held = HeldBytes(memory_bytes)
        self._models: dict[tuple[str, str], Model] = {}
        self._indexed = -1
        """The catalog generation ``_index`` and what is kept below were made from."""
        self._index_of = Models(())
        self._listings: dict[bool, pb.RepositoryIndexResponse] = {}
        """RepositoryIndex's answer, by its ``ready`` flag."""
        self._inference = Inference(
            daemon, calls.work, metrics or Metrics(), spin_seconds=launch_spin_seconds, cuda=cuda
        )

    def register(self, server: grpc.aio.Server) -> None:
        """Add the handlers to ``server`` (its interceptor admits their callers first)."""
        add = open_inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
        add(self, server)  # type: ignore[no-untyped-call, unused-ignore]

    def begin_drain(self) -> None:
        """The daemon stops: each ModelStreamInfer stream sends the answers it runs, then ends
        (an idle one at once), saying so."""
        ended = self.streams.end(_STREAMS_END)
        if ended:
            log.info("kserve streams ended", streams=ended)

    def drop_tenants_but(self, named: Collection[str]) -> int:
        """The tokens were reloaded: drop the clients of tenants they no longer name (the
        default tenant's stay); how many."""
        return self.owners.drop_tenants_but({*named, self._default.tenant})

    async def close(self) -> None:
        """Drop every KServe client (regions, sessions, buffers): at shutdown."""
        await self.owners.close()

    # Callers --------------------------------------------------------------------

    def _principal(self) -> Principal:
        return current_principal() or self._default

    async def _as_owner(
        self, call: Call, work: Callable[[Owner], Awaitable[_T]], *, fresh: bool = False
    ) -> _T:
        """Run ``work`` as the caller's client; one detached under it is made again, once.
        ``fresh``: the caller touches shared memory, so who it is is read anew."""
        for attempt in (1, 2):
            peer = parse_peer(call.peer)
            owner = await self.owners.enter(self._principal(), peer, fresh=fresh)
            try:
                return await work(owner)
            except NotFound as error:
                if error.field != "client_id" or attempt == 2:
                    raise
                self.owners.drop_later(owner)
            finally:
                self.owners.leave(owner)
        raise AssertionError("unreachable")

    async def _found(self, call: Call) -> Owner | None:
        return await self.owners.find(self._principal(), parse_peer(call.peer))

    def _index(self) -> Models:
        """The catalog's models, indexed once per catalog (a reload replaces it: what was
        kept of the old one goes)."""
        generation = self.daemon.catalog_generation
        if self._indexed != generation:
            self._index_of = Models(self.daemon.pipelines())
            self._indexed = generation
            self._models.clear()
            self._listings.clear()
        return self._index_of

    def _model(self, name: str, version: str) -> Model:
        """The model asked for; found models are kept for one catalog generation (a
        reloaded catalog drops them: docs/architecture.md, the catalog's one rule)."""
        key = (name, version)
        index = self._index()
        found = self._models.get(key)
        if found is None:
            text_field(name, "name")
            found = index.find(name, parse_version(version))
            if len(self._models) < MAX_MODELS_KEPT:
                self._models[key] = found
        return found

    # Health and metadata ------------------------------------------------------------

    @unary
    async def ServerLive(self, request: pb.ServerLiveRequest, call: Call) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    @unary
    async def ServerReady(
        self, request: pb.ServerReadyRequest, call: Call
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.daemon.serving)

    @unary
    async def ModelReady(self, request: pb.ModelReadyRequest, call: Call) -> pb.ModelReadyResponse:
        try:
            model = self._model(request.name, request.version)
        except NotFound:
            return pb.ModelReadyResponse(ready=False)
        runs = self._runs(model.pipeline, set(self.daemon.backend_formats()))
        return pb.ModelReadyResponse(ready=self.daemon.serving and runs)

    def _runs(self, pipeline: Pipeline, formats: set[ArtifactFormat]) -> bool:
        """Whether the backend's ``formats`` have a kernel for every stage of ``pipeline``."""
        return bool(formats.intersection(self.daemon.formats_of(pipeline)))

    @unary
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, call: Call
    ) -> pb.ServerMetadataResponse:
        extensions = [*EXTENSIONS, *(["cuda_shared_memory"] if self.memory.cuda else [])]
        return pb.ServerMetadataResponse(
            name="accyd", version=accyd.__version__, extensions=extensions
        )

    @unary
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, call: Call
    ) -> pb.ModelMetadataResponse:
        return self._model(request.name, request.version).metadata()

    @unary
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, call: Call
    ) -> pb.ModelConfigResponse:
        model = self._model(request.name, request.version)
        gpu = self.daemon.backend.kind.value == "cuda"
        return pb.ModelConfigResponse(config=model.config(gpu))

    # Inference ----------------------------------------------------------------------

    @unary
    async def ModelInfer(self, request: pb.ModelInferRequest, call: Call) -> pb.ModelInferResponse:
        return await self._infer(call, request)

    async def _infer(
        self,
        call: Call,
        request: pb.ModelInferRequest,
        reserve: Reserve | None = None,
        turn: Turn | None = None,
    ) -> pb.ModelInferResponse:
        """Check and run ``request`` in one of its tenant's turns (``turns.py``: a stream's
        request comes with the one its reader took; a unary call takes one first) and with
        the daemon memory it holds (``held.py``), given back once its answer has left:
        ``reserve`` (a stream's request) is awaited with the answer's size and that hold,
        and releases it once the answer is written; a unary call's once the call is over."""
        tenant = self._principal().tenant
        if turn is None:
            turn = await self.turns.acquire(tenant)
        try:
            phases = Phases()
            model = self._model(request.model_name, request.model_version)
            checked = check_request(model, request, self._max_message)
            what = f"a request of {model.name!r}"
            hold = await self.held.take(tenant, request_bytes(checked), what)
            try:
                if reserve is not None:
                    answer = sum(o.byte_size for o in checked.outputs if o.region is None)
                    await reserve(answer, hold)
                name, version = model.name, model.pipeline.version
                try:
                    response = await self._as_owner(
                        call,
                        lambda owner: self._inference.run(owner, checked, request.id, phases),
                    )
                except BaseException:
                    self.stats.failed(tenant, name, version, phases)
                    raise
            except BaseException:
                hold.release()
                raise
        finally:
            turn.release()
        if reserve is None:  # (grpc's stubs type the callback as a class of their own)
            call.context.add_done_callback(hold.on_done)  # type: ignore[arg-type]
        self.stats.succeeded(tenant, name, version, phases)
        return response

    @streaming
    async def ModelStreamInfer(
        self, request: AsyncIterator[pb.ModelInferRequest], call: Call
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Each request runs as it arrives; answers go back as they are ready, a failed one
        as its ``error_message`` (``streams.py``: how many wait, and how ends come)."""
        infer = functools.partial(self._infer, call)
        tenant = self._principal().tenant
        with self.turns.stream(tenant):
            turns = functools.partial(self.turns.acquire, tenant)
            async for reply in self.streams.serve(request, call, infer, turns):
                yield reply

    # Statistics and repository ----------------------------------------------------

    @unary
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, call: Call
    ) -> pb.ModelStatisticsResponse:
        tenant = self._principal().tenant
        index = self._index()
        if request.name:
            model = self._model(request.name, request.version)  # NotFound for an unknown one
            wanted = [model.pipeline] if request.version else list(index.versions(model.name))
        elif request.version:
            raise InvalidRequest("a version needs a model name", field="version")
        else:
            wanted = list(index.pipelines)
        return pb.ModelStatisticsResponse(
            model_stats=[self.stats.proto(tenant, p.target, p.version) for p in wanted]
        )

    @unary
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, call: Call
    ) -> pb.RepositoryIndexResponse:
        """Every model (made once per catalog and kept: it is the same for every caller)."""
        index = self._index()
        listing = self._listings.get(request.ready)
        if listing is None:
            listing = self._listings[request.ready] = self._listing(index, request.ready)
        return listing

    def _listing(self, index: Models, ready: bool) -> pb.RepositoryIndexResponse:
        formats = set(self.daemon.backend_formats())
        models = []
        for pipeline in index.pipelines:
            runs = self._runs(pipeline, formats)
            if ready and not runs:
                continue
            models.append(
                pb.RepositoryIndexResponse.ModelIndex(
                    name=pipeline.target,
                    version=str(pipeline.version),
                    state="READY" if runs else "UNAVAILABLE",
                    reason="" if runs else "no kernel for this daemon's backend",
                )
            )
        return pb.RepositoryIndexResponse(models=models)

    @unary
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, call: Call
    ) -> pb.RepositoryModelLoadResponse:
        if request.parameters:
            raise InvalidRequest(
                "models come from the operator's catalog: a load takes no config or files",
                field="parameters",
            )
        if ADMIN_SCOPE in self._principal().scopes:
            # An operator's load: the catalog folders read again (the model new or changed).
            await asyncio.to_thread(self.daemon.reload_catalog)
            self._model(request.model_name, "")  # NotFound if the catalog still lacks it
            return pb.RepositoryModelLoadResponse()
        model = self._model(request.model_name, "")
        pipeline = model.pipeline

        async def load(owner: Owner) -> None:
            await owner.models.session(
                pipeline.target, pipeline.version, bool(pipeline.intermediates)
            )

        await self._as_owner(call, load)
        return pb.RepositoryModelLoadResponse()

    @unary
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, call: Call
    ) -> pb.RepositoryModelUnloadResponse:
        model = self._model(request.model_name, "")
        if ADMIN_SCOPE in self._principal().scopes:
            # An operator's unload: no new load finds the model until a reload reads it again.
            await asyncio.to_thread(self.daemon.remove_pipeline, model.name)
            return pb.RepositoryModelUnloadResponse()
        owner = await self._found(call)
        if owner is not None:
            await owner.models.unload(model.name)
        return pb.RepositoryModelUnloadResponse()

    # Shared memory --------------------------------------------------------------------

    @unary
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, call: Call
    ) -> pb.SystemSharedMemoryStatusResponse:
        return self.memory.status(
            await self._found(call), text_field(request.name, "name", required=False)
        )

    @unary
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, call: Call
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._as_owner(call, lambda owner: self.memory.register(owner, request), fresh=True)
        return pb.SystemSharedMemoryRegisterResponse()

    @unary
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, call: Call
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.memory.unregister(
            await self._found(call), text_field(request.name, "name", required=False)
        )
        return pb.SystemSharedMemoryUnregisterResponse()

    @unary
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, call: Call
    ) -> pb.CudaSharedMemoryStatusResponse:
        name = text_field(request.name, "name", required=False)
        return self.memory.cuda_status(await self._found(call), name)

    @unary
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, call: Call
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self._as_owner(
            call, lambda owner: self.memory.cuda_register(owner, request), fresh=True
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @unary
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, call: Call
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        name = text_field(request.name, "name", required=False)
        await self.memory.cuda_unregister(await self._found(call), name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # Not served -------------------------------------------------------------------------

    @unary
    async def TraceSetting(
        self, request: pb.TraceSettingRequest, call: Call
    ) -> pb.TraceSettingResponse:
        raise UnsupportedOperation("accyd serves no trace settings")

    @unary
    async def LogSettings(
        self, request: pb.LogSettingsRequest, call: Call
    ) -> pb.LogSettingsResponse:
        raise UnsupportedOperation("accyd serves no log settings: see its --log-level")


_STREAMS_END = ShuttingDown(
    "the daemon is shutting down: this stream takes no more requests (those it took were "
    "answered); open one on its successor"
)
