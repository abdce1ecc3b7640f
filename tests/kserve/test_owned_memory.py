"""Owned system shared memory: Triton's shared-memory bugs, each as a case that must hold.

Two tenants (alpha, beta) and processes of their own, against one daemon that needs
tokens. Regions belong to the client that registered them (triton #3428); keys that name
what they should not are refused without following or blocking; errors repeat only what
the caller gave; every bound of register and infer is checked; a truncated object fails
a copy, not the daemon; unregister races infers (#3207); dead owners' regions go (#7481).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from accy.testing import RunningDaemon
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.protocol import open_inference_pb2_grpc
from tests.kserve.harness import (
    SHM,
    Door,
    descriptors,
    loopback_clients,
    make_object,
    shm_names,
    simple_request,
    url_of,
    wait_until,
)

INTS = np.arange(16, dtype=np.int32)
ONES = np.ones(16, dtype=np.int32)


@pytest.fixture
def doors(guarded: RunningDaemon, tokens: dict[str, str]) -> Iterator[tuple[Door, Door]]:
    alpha, beta = (
        Door(url_of(guarded, "tcp"), tokens["alpha"]),
        Door(url_of(guarded, "tcp"), tokens["beta"]),
    )
    yield alpha, beta
    for door in (alpha, beta):
        door("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest())
        door.close()


@pytest.fixture
def objects() -> Iterator[list[str]]:
    """Names of shared-memory objects a test made; removed after it."""
    made: list[str] = []
    yield made
    for name in made:
        (SHM / name).unlink(missing_ok=True)


def _inputs(objects: list[str], name: str) -> None:
    make_object(name, 128, INTS.tobytes() + ONES.tobytes())
    objects.append(name)


def test_another_tenants_unregister_all_status_and_infer_see_nothing(
    doors: tuple[Door, Door], objects: list[str]
) -> None:
    alpha, beta = doors
    _inputs(objects, "kserve_t_3428")
    alpha.register("mine", "/kserve_t_3428", 128)
    beta("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest())  # all of beta's
    assert beta.regions() == set()
    error = beta.refusal(
        "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="mine")
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = beta.refusal("ModelInfer", simple_request(regions=[("mine", 0), ("mine", 64)]))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    beta("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name="mine"))
    assert alpha.regions() == {"mine"}  # still alpha's, and it still works
    answer = alpha("ModelInfer", simple_request(regions=[("mine", 0), ("mine", 64)]))
    assert np.array_equal(np.frombuffer(answer.raw_output_contents[0], np.int32), INTS + ONES)


def test_another_process_of_another_tenant_sees_none_of_them(
    guarded: RunningDaemon, tokens: dict[str, str], doors: tuple[Door, Door], objects: list[str]
) -> None:
    alpha, _ = doors
    _inputs(objects, "kserve_t_proc")
    alpha.register("shared", "/kserve_t_proc", 128)
    probe = (
        "import sys, grpc\n"
        "from accyd.doors.kserve.protocol import open_inference_pb2 as pb\n"
        "from accyd.doors.kserve.protocol import open_inference_pb2_grpc as g\n"
        "stub = g.GRPCInferenceServiceStub(grpc.insecure_channel(sys.argv[1]))\n"
        "md = (('authorization', 'Bearer ' + sys.argv[2]),)\n"
        "stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), metadata=md)\n"
        "ask = pb.SystemSharedMemoryStatusRequest()\n"
        "status = stub.SystemSharedMemoryStatus(ask, metadata=md)\n"
        "print(sorted(status.regions))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, url_of(guarded, "tcp"), tokens["beta"]],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[]"
    assert alpha.regions() == {"shared"}


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("/kserve_t_missing", grpc.StatusCode.NOT_FOUND),
        ("/", grpc.StatusCode.INVALID_ARGUMENT),
        ("/..", grpc.StatusCode.INVALID_ARGUMENT),
        ("..", grpc.StatusCode.INVALID_ARGUMENT),
        ("/a/../../etc/passwd", grpc.StatusCode.INVALID_ARGUMENT),
        ("/kserve\0t", grpc.StatusCode.INVALID_ARGUMENT),
        ("/" + "k" * 300, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_hostile_keys_are_refused(
    doors: tuple[Door, Door], key: str, code: grpc.StatusCode
) -> None:
    alpha, _ = doors
    error = alpha.refusal(
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(name="r", key=key, byte_size=64),
    )
    assert error.code() == code, error.details()
    _names_nothing_of_the_daemon(error)


def test_symlinks_fifos_and_another_users_objects_are_refused(
    doors: tuple[Door, Door], objects: list[str]
) -> None:
    alpha, _ = doors
    _inputs(objects, "kserve_t_real")
    os.symlink(SHM / "kserve_t_real", SHM / "kserve_t_link")
    objects.append("kserve_t_link")
    os.mkfifo(SHM / "kserve_t_fifo")
    objects.append("kserve_t_fifo")
    for key in ("/kserve_t_link", "/kserve_t_fifo"):  # a FIFO must not block the daemon
        error = alpha.refusal(
            "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(name="r", key=key, byte_size=64),
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        _names_nothing_of_the_daemon(error)
    if os.geteuid() == 0:  # another user's object: only root can make one here
        _inputs(objects, "kserve_t_theirs")
        os.chown(SHM / "kserve_t_theirs", 65534, 65534)
        error = alpha.refusal(
            "SystemSharedMemoryRegister",
            pb.SystemSharedMemoryRegisterRequest(name="r", key="/kserve_t_theirs", byte_size=64),
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert alpha.regions() == set()


@pytest.mark.parametrize(
    ("offset", "byte_size", "code"),
    [
        (0, 0, grpc.StatusCode.INVALID_ARGUMENT),
        (0, 129, grpc.StatusCode.INVALID_ARGUMENT),
        (128, 1, grpc.StatusCode.INVALID_ARGUMENT),
        (64, 65, grpc.StatusCode.INVALID_ARGUMENT),
        (2**63, 64, grpc.StatusCode.INVALID_ARGUMENT),
        (0, 2**64 - 1, grpc.StatusCode.INVALID_ARGUMENT),
        (2**64 - 1, 2**64 - 1, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_register_bounds(
    doors: tuple[Door, Door], objects: list[str], offset: int, byte_size: int, code: grpc.StatusCode
) -> None:
    alpha, _ = doors
    _inputs(objects, "kserve_t_bounds")
    error = alpha.refusal(
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(
            name="r", key="/kserve_t_bounds", offset=offset, byte_size=byte_size
        ),
    )
    assert error.code() == code
    assert alpha.regions() == set()


def _shm_input(request: pb.ModelInferRequest, index: int, **values: int) -> pb.ModelInferRequest:
    for key, value in values.items():
        request.inputs[index].parameters[f"shared_memory_{key}"].int64_param = value
    return request


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"byte_size": 60}, grpc.StatusCode.INVALID_ARGUMENT),  # not the tensor's size
        ({"byte_size": 128}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"offset": 65}, grpc.StatusCode.INVALID_ARGUMENT),  # past the region's end
        ({"offset": 2**62}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"offset": -1}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"byte_size": -64}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_infer_bounds(
    doors: tuple[Door, Door], objects: list[str], change: dict[str, int], code: grpc.StatusCode
) -> None:
    alpha, _ = doors
    _inputs(objects, "kserve_t_ib")
    alpha.register("in", "/kserve_t_ib", 128)
    request = _shm_input(simple_request(regions=[("in", 0), ("in", 64)]), 1, **change)
    error = alpha.refusal("ModelInfer", request)
    assert error.code() == code, error.details()
    _names_nothing_of_the_daemon(error)


def test_an_output_region_too_small_is_refused_before_anything_runs(
    guarded: RunningDaemon, doors: tuple[Door, Door], objects: list[str]
) -> None:
    alpha, _ = doors
    make_object("kserve_t_out", 96)
    objects.append("kserve_t_out")
    alpha.register("out", "/kserve_t_out", 96)
    before = _launches(guarded, alpha)
    request = simple_request(INTS, ONES, outputs=[("OUTPUT0", "out", 0), ("OUTPUT1", "out", 64)])
    error = alpha.refusal("ModelInfer", request)  # the second output would pass the end
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    request.outputs[1].parameters["shared_memory_byte_size"].int64_param = 32
    error = alpha.refusal("ModelInfer", request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _launches(guarded, alpha) == before


def test_an_object_truncated_after_register_fails_cleanly(
    doors: tuple[Door, Door], objects: list[str]
) -> None:
    alpha, _ = doors
    path = make_object("kserve_t_trunc", 128, INTS.tobytes() + ONES.tobytes())
    objects.append("kserve_t_trunc")
    alpha.register("in", "/kserve_t_trunc", 128)
    alpha.register("out", "/kserve_t_trunc", 128)
    os.truncate(path, 32)
    error = alpha.refusal("ModelInfer", simple_request(regions=[("in", 0), ("in", 64)]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "truncated" in error.details()
    os.truncate(path, 128)  # whole again: the same region works
    alpha("ModelInfer", simple_request(INTS, ONES, outputs=[("OUTPUT0", "out", 64)]))
    os.truncate(path, 0)
    error = alpha.refusal(
        "ModelInfer", simple_request(INTS, ONES, outputs=[("OUTPUT0", "out", 64)])
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert path.stat().st_size == 0  # not grown by the daemon's write
    assert alpha("ServerLive", pb.ServerLiveRequest()).live


def test_unregister_during_a_thousand_concurrent_infers(
    guarded: RunningDaemon, tokens: dict[str, str], objects: list[str]
) -> None:
    _inputs(objects, "kserve_t_race")
    target, token = url_of(guarded, "tcp"), tokens["alpha"]
    alpha = Door(target, token)
    alpha.register("race", "/kserve_t_race", 128)
    fds = descriptors(guarded)

    async def storm() -> list[grpc.StatusCode]:
        metadata = (("authorization", f"Bearer {token}"),)
        async with grpc.aio.insecure_channel(target) as channel:
            stub = open_inference_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = simple_request(regions=[("race", 0), ("race", 64)])

            async def one() -> grpc.StatusCode:
                try:
                    await stub.ModelInfer(request, metadata=metadata, timeout=120)
                except grpc.aio.AioRpcError as error:
                    return error.code()
                return grpc.StatusCode.OK

            calls = [asyncio.ensure_future(one()) for _ in range(1000)]
            await asyncio.sleep(0.2)
            await stub.SystemSharedMemoryUnregister(
                pb.SystemSharedMemoryUnregisterRequest(name="race"), metadata=metadata
            )
            return list(await asyncio.gather(*calls))

    codes = asyncio.run(storm())
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND}, set(codes)
    assert alpha("ServerLive", pb.ServerLiveRequest()).live
    assert alpha.regions() == set()
    wait_until(lambda: descriptors(guarded) <= fds - 1, what="the region's descriptor closed")
    alpha.close()


def test_fifty_sigkilled_owners_leave_nothing_behind(
    guarded: RunningDaemon, tokens: dict[str, str], objects: list[str]
) -> None:
    wait_until(lambda: loopback_clients(guarded) == 0, what="earlier loopback clients dropped")
    fds, names = descriptors(guarded), shm_names()
    owner = (
        "import sys, time, grpc\n"
        "from accyd.doors.kserve.protocol import open_inference_pb2 as pb\n"
        "from accyd.doors.kserve.protocol import open_inference_pb2_grpc as g\n"
        "stub = g.GRPCInferenceServiceStub(grpc.insecure_channel(sys.argv[1]))\n"
        "md = (('authorization', 'Bearer ' + sys.argv[2]),)\n"
        "stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(\n"
        "    name=sys.argv[3], key='/' + sys.argv[3], byte_size=128), metadata=md)\n"
        "print('registered', flush=True)\n"
        "time.sleep(300)\n"
    )
    victims = []
    for index in range(50):
        name = f"kserve_t_victim{index}"
        _inputs(objects, name)
        victims.append(
            subprocess.Popen(
                [sys.executable, "-c", owner, url_of(guarded, "tcp"), tokens["beta"], name],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for victim in victims:
            assert victim.stdout is not None
            assert victim.stdout.readline().strip() == "registered"
        assert descriptors(guarded) >= fds + 50  # a region's descriptor each (and connections)
    finally:
        for victim in victims:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
    wait_until(lambda: descriptors(guarded) <= fds, timeout=30, what="descriptors at baseline")
    assert Door(url_of(guarded, "tcp"), tokens["beta"]).regions() == set()
    assert shm_names() - names <= set(objects)  # nothing of the daemon's own


def test_a_huge_declared_shape_is_refused_before_anything_is_allocated(
    guarded: RunningDaemon, doors: tuple[Door, Door]
) -> None:
    alpha, _ = doors
    before = _launches(guarded, alpha)
    request = simple_request(INTS, ONES)
    for shape in ([2**40, 16], [2**62], [-1, 16], [0, 16]):
        del request.inputs[0].shape[:]
        request.inputs[0].shape.extend(shape)
        error = alpha.refusal("ModelInfer", request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, shape
    assert _launches(guarded, alpha) == before


def test_a_client_holds_at_most_its_regions(doors: tuple[Door, Door], objects: list[str]) -> None:
    alpha, _ = doors
    _inputs(objects, "kserve_t_many")
    for index in range(64):
        alpha.register(f"r{index}", "/kserve_t_many", 128)
    error = alpha.refusal(
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(name="r64", key="/kserve_t_many", byte_size=128),
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    error = alpha.refusal(
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(name="r0", key="/kserve_t_many", byte_size=128),
    )
    assert error.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.RESOURCE_EXHAUSTED)


def _launches(daemon: RunningDaemon, door: Door) -> int:
    from tests.kserve.harness import launches_total

    token = dict(door.metadata).get("authorization", "").removeprefix("Bearer ") or None
    return launches_total(daemon, token)


def _names_nothing_of_the_daemon(error: grpc.RpcError) -> None:
    """An error repeats only what the caller sent: no daemon path or descriptor."""
    details = error.details() or ""
    assert "/dev/shm" not in details and "/proc" not in details, details
    assert "fd" not in details.split(), details
