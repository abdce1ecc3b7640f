"""Helpers of the security tests: a tokens file, callers that send a bearer token, servers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accyd.tokens import hash_token, new_token
from tests.launch_service.harness import ServerThread, make_config


@dataclass(frozen=True)
class TokenSpec:
    """One ``[[token]]`` entry; the token itself is made by ``write_tokens``."""

    tenant: str
    scopes: Sequence[str] = ("launch",)
    quotas: dict[str, int] = field(default_factory=dict)


def write_tokens(path: Path, specs: dict[str, TokenSpec]) -> dict[str, str]:
    """Write a tokens file of ``specs``; returns the token of each spec's key."""
    tokens = {key: new_token() for key in specs}
    lines = []
    for key, spec in specs.items():
        scopes = ", ".join(f'"{scope}"' for scope in spec.scopes)
        lines += ["[[token]]", f'tenant = "{spec.tenant}"']
        lines += [f'sha256 = "{hash_token(tokens[key])}"', f"scopes = [{scopes}]"]
        if spec.quotas:
            lines.append("[token.quotas]")
            lines += [f"{name} = {value}" for name, value in spec.quotas.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return tokens


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    return () if token is None else (("authorization", f"Bearer {token}"),)


@dataclass
class Caller:
    """Calls the launch service with a token and, once attached, a client id."""

    channel: grpc.Channel
    token: str | None = None
    client_id: str | None = None
    stream: Any = None

    @property
    def stub(self) -> launch_pb2_grpc.LaunchServiceStub:
        return launch_pb2_grpc.LaunchServiceStub(self.channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        client = () if self.client_id is None else (("accy-client-id", self.client_id),)
        return bearer(self.token) + client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.stub, name)
        return lambda request, **kw: method(request, metadata=self.metadata, timeout=20, **kw)

    def attach(self, name: str = "test") -> pb.Attached:
        self.stream = self.stub.Attach(pb.AttachRequest(client_name=name), metadata=self.metadata)
        attached = next(self.stream).attached
        self.client_id = attached.client_id
        return attached

    def detach(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def buffer(self, byte_size: int) -> str:
        request = pb.AllocateBufferRequest(byte_size=byte_size, dtype=pb.DTYPE_F32)
        return str(self.AllocateBuffer(request).buffer_id)

    def load(self, target: str) -> str:
        return str(self.LoadPipeline(pb.LoadPipelineRequest(target=target)).session_id)

    def status(self) -> pb.GetStatusResponse:
        return self.GetStatus(pb.GetStatusRequest())


def serving_with_tokens(
    folder: Path, transport: str, tokens_file: Path, **overrides: Any
) -> ServerThread:
    """A server on ``transport`` that needs tokens (TCP served without TLS: ``insecure``)."""
    return ServerThread(make_config(folder, transport, tokens_file=tokens_file, **overrides))


def callers(channel: grpc.Channel, *tokens: str | None) -> Iterator[Caller]:
    for token in tokens:
        yield Caller(channel, token)
