"""``--health-listen``: the health service alone, plaintext, for the kubelet's gRPC probes."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from accy.protocol.launch.v1 import launch_pb2 as pb
from accy.protocol.launch.v1 import launch_pb2_grpc
from accy.testing import free_port, running_daemon


def test_the_probe_port_answers_health_and_nothing_else() -> None:
    probe = f"127.0.0.1:{free_port()}"
    with running_daemon(tcp=False, extra=("--health-listen", probe)) as daemon:
        with grpc.insecure_channel(probe) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "accy.launch.v1.LaunchService"):
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            # No launch service there: a probe port must not be a way around TLS and tokens.
            launches = launch_pb2_grpc.LaunchServiceStub(channel)
            try:
                launches.ListPipelines(pb.ListPipelinesRequest(), timeout=5)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNIMPLEMENTED
            else:
                raise AssertionError("the probe port served the launch service")
        assert "health_listen" in daemon.log_text()
