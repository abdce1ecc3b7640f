"""The KServe v2 HTTP/REST routes, each one RPC of the KServe gRPC door's service.

Every route builds the protocol request its RPC takes, runs the gRPC door's
handler (``KServeServicer``) through the daemon's admission as that RPC
(tokens, scopes, tenants: ``Admission.admitted``) with the HTTP request as its
context (``context.py``), and writes the answer as Triton's HTTP server does.
A refusal leaves as ``Refused`` or a domain error, which ``door.py`` answers
through ``refusals.py``. A body is read only after the caller is admitted, and
never past the door's bound.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from accyd.doors.grpc.admission import Admission
from accyd.doors.grpc.calls import Context
from accyd.doors.kserve.infer import INLINE_BYTES
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.servicer import SERVICE_NAME, KServeServicer
from accyd.doors.kserve_http.bodies import (
    HEADER_LENGTH,
    answer,
    parse_request,
    response_headers,
)
from accyd.doors.kserve_http.context import HttpContext
from accyd.doors.kserve_http.messages import to_json
from accyd.errors import AccyError, InvalidRequest

__all__ = ["Routes"]

_Work = Callable[[web.Request, Context], Awaitable[web.StreamResponse]]
_MODEL = "/v2/models/{model}"
_VERSION = "/v2/models/{model}/versions/{version}"


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(value).encode(), content_type="application/json"
    )


def _model(request: web.Request) -> tuple[str, str]:
    return request.match_info["model"], request.match_info.get("version", "")


class Routes:
    """The door's routes over one ``KServeServicer``, admitted by ``admission``."""

    def __init__(
        self, servicer: KServeServicer, admission: Admission, *, max_body_bytes: int
    ) -> None:
        self.servicer = servicer
        self.max_body_bytes = max_body_bytes
        self._admission = admission

    def add_to(self, app: web.Application) -> None:
        routes = app.router
        get, post = routes.add_get, routes.add_post
        get("/v2/health/live", self._as("ServerLive", self._live))
        get("/v2/health/ready", self._as("ServerReady", self._ready))
        get("/v2", self._as("ServerMetadata", self._server_metadata))
        get("/v2/models/stats", self._as("ModelStatistics", self._statistics))
        for path in (_MODEL, _VERSION):
            get(path, self._as("ModelMetadata", self._model_metadata))
            get(f"{path}/ready", self._as("ModelReady", self._model_ready))
            get(f"{path}/config", self._as("ModelConfig", self._model_config))
            get(f"{path}/stats", self._as("ModelStatistics", self._statistics))
            post(f"{path}/infer", self._as("ModelInfer", self._infer))
        post("/v2/repository/index", self._as("RepositoryIndex", self._index))
        post("/v2/repository/models/{model}/load", self._as("RepositoryModelLoad", self._load))
        post(
            "/v2/repository/models/{model}/unload", self._as("RepositoryModelUnload", self._unload)
        )
        for kind in ("System", "Cuda"):
            base = f"/v2/{kind.lower()}sharedmemory"
            status = self._as(f"{kind}SharedMemoryStatus", self._memory_status)
            get(f"{base}/status", status)
            get(f"{base}/region/{{name}}/status", status)
            register = self._as(f"{kind}SharedMemoryRegister", self._register)
            post(f"{base}/region/{{name}}/register", register)
            unregister = self._as(f"{kind}SharedMemoryUnregister", self._unregister)
            post(f"{base}/unregister", unregister)
            post(f"{base}/region/{{name}}/unregister", unregister)

    def _as(
        self, method: str, work: _Work
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The route's handler: ``work`` admitted as the gRPC call ``method``."""
        admitted = self._admission.admitted(SERVICE_NAME, method, work)

        async def handler(request: web.Request) -> web.StreamResponse:
            request["accy_method"] = method  # what the handler of ``work`` calls
            context = HttpContext(request)
            try:
                response: web.StreamResponse = await admitted(request, context)
            finally:
                context.done()
            return response

        return handler

    def _call(self, request: web.Request) -> Callable[..., Awaitable[Any]]:
        """The gRPC door's handler of this route's RPC."""
        method: Callable[..., Awaitable[Any]] = getattr(self.servicer, request["accy_method"])
        return method

    async def _body(self, request: web.Request) -> bytes:
        """The request's body, refused unread past the bound (413)."""
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_body_bytes, actual_size=length)
        return await request.read()  # the application's client_max_size bounds a chunked one

    async def _json_body(self, request: web.Request) -> dict[str, Any]:
        body = await self._body(request)
        if not body.strip():
            return {}
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise InvalidRequest("the request body is not JSON", field="body") from None
        if not isinstance(value, dict):
            raise InvalidRequest("the request body must be a JSON object", field="body")
        return value

    # Health and metadata ------------------------------------------------------------

    async def _live(self, request: web.Request, context: Context) -> web.StreamResponse:
        live = (await self._call(request)(pb.ServerLiveRequest(), context)).live
        return _json({"live": live}, 200 if live else 503)

    async def _ready(self, request: web.Request, context: Context) -> web.StreamResponse:
        ready = (await self._call(request)(pb.ServerReadyRequest(), context)).ready
        return _json({"ready": ready}, 200 if ready else 503)

    async def _server_metadata(self, request: web.Request, context: Context) -> web.StreamResponse:
        return _json(to_json(await self._call(request)(pb.ServerMetadataRequest(), context)))

    async def _model_metadata(self, request: web.Request, context: Context) -> web.StreamResponse:
        name, version = _model(request)
        asked = pb.ModelMetadataRequest(name=name, version=version)
        return _json(to_json(await self._call(request)(asked, context)))

    async def _model_ready(self, request: web.Request, context: Context) -> web.StreamResponse:
        name, version = _model(request)
        asked = pb.ModelReadyRequest(name=name, version=version)
        ready = (await self._call(request)(asked, context)).ready
        return _json({"name": name, "ready": ready}, 200 if ready else 503)

    async def _model_config(self, request: web.Request, context: Context) -> web.StreamResponse:
        name, version = _model(request)
        asked = pb.ModelConfigRequest(name=name, version=version)
        return _json(to_json((await self._call(request)(asked, context)).config))

    # Inference ----------------------------------------------------------------------

    async def _infer(self, request: web.Request, context: Context) -> web.StreamResponse:
        name, version = _model(request)
        body = await self._body(request)
        header_length = request.headers.get(HEADER_LENGTH)
        split = len(body)
        if header_length is not None:
            if not header_length.isdigit() or int(header_length) > len(body):
                raise InvalidRequest(
                    f"{HEADER_LENGTH} must be the JSON header's byte count, at most the body's "
                    f"{len(body)}",
                    field=HEADER_LENGTH,
                )
            split = int(header_length)
        try:
            model = self.servicer._model(name, version)
        except AccyError:  # answered by the gRPC door's handler, as it words it
            model = None
        view = memoryview(body)
        parse = (view[:split].tobytes(), view[split:], name, version, model)
        if split <= INLINE_BYTES:
            inference = parse_request(*parse)
        else:  # a large JSON header takes the loop long: parsed on a thread
            inference = await asyncio.to_thread(parse_request, *parse)
        response = await self._call(request)(inference.request, context)
        if sum(map(len, response.raw_output_contents)) <= INLINE_BYTES:
            header, tail = answer(inference, response)
        else:  # JSON of large outputs too
            header, tail = await asyncio.to_thread(answer, inference, response)
        return web.Response(body=b"".join((header, *tail)), headers=response_headers(header, tail))

    # Statistics and repository ------------------------------------------------------

    async def _statistics(self, request: web.Request, context: Context) -> web.StreamResponse:
        name = request.match_info.get("model", "")
        asked = pb.ModelStatisticsRequest(name=name, version=request.match_info.get("version", ""))
        return _json(to_json(await self._call(request)(asked, context)))

    async def _index(self, request: web.Request, context: Context) -> web.StreamResponse:
        ready = (await self._json_body(request)).get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidRequest("ready must be true or false", field="ready")
        index = await self._call(request)(pb.RepositoryIndexRequest(ready=ready), context)
        return _json([to_json(model) for model in index.models])

    async def _load(self, request: web.Request, context: Context) -> web.StreamResponse:
        body = await self._json_body(request)
        asked = pb.RepositoryModelLoadRequest(model_name=request.match_info["model"])
        given = body.get("parameters", {})
        for key, value in (given if isinstance(given, dict) else {"": given}).items():
            asked.parameters[key].string_param = json.dumps(value)  # refused, as over gRPC
        await self._call(request)(asked, context)
        return _json({})

    async def _unload(self, request: web.Request, context: Context) -> web.StreamResponse:
        await self._json_body(request)
        asked = pb.RepositoryModelUnloadRequest(model_name=request.match_info["model"])
        await self._call(request)(asked, context)
        return _json({})

    # Shared memory ------------------------------------------------------------------

    async def _memory_status(self, request: web.Request, context: Context) -> web.StreamResponse:
        name = request.match_info.get("name", "")
        method = request["accy_method"]
        asked = getattr(pb, f"{method}Request")(name=name)
        status = await self._call(request)(asked, context)
        return _json([to_json(region) for region in status.regions.values()])

    async def _register(self, request: web.Request, context: Context) -> web.StreamResponse:
        body = await self._json_body(request)
        method = request["accy_method"]
        asked = getattr(pb, f"{method}Request")(name=request.match_info["name"])
        if method.startswith("Cuda"):
            handle = body.get("raw_handle")
            text = handle.get("b64") if isinstance(handle, dict) else None
            if not isinstance(text, str):
                raise InvalidRequest('raw_handle must be {"b64": "<base64>"}', field="raw_handle")
            asked.raw_handle = _base64(text)
            fields: tuple[str, ...] = ("device_id", "byte_size")
        else:
            key = body.get("key", "")
            if not isinstance(key, str):
                raise InvalidRequest("key must be a string (as shm_open takes it)", field="key")
            asked.key = key
            fields = ("offset", "byte_size")
        for key in fields:
            value = body.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
                raise InvalidRequest(f"{key} must be a non-negative integer", field=key)
            setattr(asked, key, value)
        await self._call(request)(asked, context)
        return _json({})

    async def _unregister(self, request: web.Request, context: Context) -> web.StreamResponse:
        await self._json_body(request)
        method = request["accy_method"]
        asked = getattr(pb, f"{method}Request")(name=request.match_info.get("name", ""))
        await self._call(request)(asked, context)
        return _json({})


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("raw_handle.b64 is not base64", field="raw_handle") from None
