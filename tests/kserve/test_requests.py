"""Requests checked into domain values: models' metadata, scalars, shapes, sources, peers."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import numpy as np
import pytest

from accyd.catalog import load_catalog
from accyd.core.tenants import Quotas
from accyd.doors.kserve.models import Model, find_model, parse_version
from accyd.doors.kserve.owners import Owner, Owners
from accyd.doors.kserve.peers import Peer, TcpTable, loopback_owner, parse_peer
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.tensors import check_request
from accyd.errors import (
    AccyError,
    InvalidRequest,
    LaunchArgumentMismatch,
    NotFound,
    PermissionDenied,
)
from accyd.tokens import Principal

PIPELINES = load_catalog().pipelines
LIMIT = 1 << 26


def model(name: str) -> Model:
    return find_model(PIPELINES, name, 0)


def request(name: str, *inputs: tuple[str, str, list[int], bytes]) -> pb.ModelInferRequest:
    made = pb.ModelInferRequest(model_name=name)
    for tensor, datatype, shape, data in inputs:
        made.inputs.add(name=tensor, datatype=datatype, shape=shape)
        made.raw_input_contents.append(data)
    return made


def f32(count: int) -> bytes:
    return np.ones(count, dtype=np.float32).tobytes()


def test_metadata_dims_are_extents_or_minus_one() -> None:
    scan = model("accy.kernel.device_scan").metadata()
    assert [(t.name, t.datatype, list(t.shape)) for t in scan.inputs] == [("x", "FP32", [-1])]
    assert [
        (t.name, list(t.shape)) for t in model("accy.kernel.reduce_sum").metadata().outputs
    ] == [("total", [1])]
    config = model("accy.kernel.saxpy").config(gpu=False)
    assert config.max_batch_size == 0 and set(config.parameters) == {"scalar.n", "scalar.a"}
    assert "element count of input x" in config.parameters["scalar.n"].string_value


def test_versions_and_unknown_models() -> None:
    assert model("simple").metadata().versions == ["1"]
    with pytest.raises(NotFound):
        find_model(PIPELINES, "nope", 0)
    with pytest.raises(NotFound):
        find_model(PIPELINES, "simple", 9)
    for text in ("0", "x", "-1", "1" * 12):
        with pytest.raises(InvalidRequest):
            parse_version(text)


def test_a_scalar_left_out_is_the_inputs_length_and_outputs_take_its_shape() -> None:
    saxpy = request(
        "accy.kernel.saxpy", ("x", "FP32", [2, 50], f32(100)), ("y", "FP32", [100], f32(100))
    )
    saxpy.parameters["a"].double_param = 2.0
    checked = check_request(model("accy.kernel.saxpy"), saxpy, LIMIT)
    assert {k: v.value for k, v in checked.scalars.items()} == {"n": 100, "a": 2.0}
    assert [o.shape for o in checked.outputs] == [(2, 50)]
    total = check_request(
        model("accy.kernel.reduce_sum"),
        request("accy.kernel.reduce_sum", ("x", "FP32", [7], f32(7))),
        LIMIT,
    )
    assert [o.shape for o in total.outputs] == [(1,)]


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [("int64_param", 3, 3.0), ("string_param", "2.5", 2.5), ("bool_param", True, 1.0)],
)
def test_parameters_of_each_kind_perf_analyzer_sends(
    kind: str, value: object, expected: float
) -> None:
    saxpy = request("accy.kernel.saxpy", ("x", "FP32", [4], f32(4)), ("y", "FP32", [4], f32(4)))
    setattr(saxpy.parameters["a"], kind, value)
    saxpy.parameters["triton_enable_empty_final_response"].bool_param = True  # ignored
    assert check_request(model("accy.kernel.saxpy"), saxpy, LIMIT).scalars["a"].value == expected


@pytest.mark.parametrize(
    ("name", "set_value", "error"),
    [
        ("b", lambda p: setattr(p, "double_param", 1.0), InvalidRequest),  # no such scalar
        ("a", lambda p: setattr(p, "string_param", "two"), InvalidRequest),
        ("n", lambda p: setattr(p, "int64_param", 5), LaunchArgumentMismatch),  # != length
        ("n", lambda p: setattr(p, "int64_param", 0), LaunchArgumentMismatch),  # below min
        ("n", lambda p: setattr(p, "int64_param", -1), LaunchArgumentMismatch),
        ("n", lambda p: setattr(p, "double_param", 4.5), InvalidRequest),
    ],
)
def test_bad_parameters_are_refused(name: str, set_value: object, error: type[AccyError]) -> None:
    saxpy = request("accy.kernel.saxpy", ("x", "FP32", [4], f32(4)), ("y", "FP32", [4], f32(4)))
    saxpy.parameters["a"].double_param = 1.0
    set_value(saxpy.parameters[name])  # type: ignore[operator]
    with pytest.raises(error):
        check_request(model("accy.kernel.saxpy"), saxpy, LIMIT)


def test_inputs_must_agree_with_themselves_and_the_model() -> None:
    simple = model("simple")
    good = ("INPUT0", "INT32", [1, 16], bytes(64)), ("INPUT1", "INT32", [1, 16], bytes(64))
    check_request(simple, request("simple", *good), LIMIT)
    cases = [
        request("simple", good[0]),  # one missing
        request("simple", good[0], good[0]),  # twice
        request("simple", good[0], ("INPUT1", "FP32", [1, 16], bytes(64))),
        request("simple", good[0], ("INPUT1", "BYTES", [1, 16], bytes(64))),
        request("simple", good[0], ("INPUT1", "INT32", [1, 16], bytes(60))),
        request("simple", good[0], ("INPUT1", "INT32", [1, 8], bytes(32))),  # not 16
        request("simple", good[0], ("INPUT2", "INT32", [1, 16], bytes(64))),
    ]
    extra = request("simple", *good)
    extra.raw_input_contents.append(b"x")
    cases.append(extra)
    outputs = request("simple", *good)
    outputs.outputs.add(name="OUTPUT7")
    cases.append(outputs)
    for bad in cases:
        with pytest.raises(AccyError):
            check_request(simple, bad, LIMIT)


def test_typed_contents_are_taken_and_checked() -> None:
    simple = model("simple")
    made = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        made.inputs.add(name=name, datatype="INT32", shape=[16]).contents.int_contents.extend(
            range(16)
        )
    checked = check_request(simple, made, LIMIT)
    assert checked.inputs[0].data == np.arange(16, dtype=np.int32).tobytes()
    del made.inputs[1].contents.int_contents[3:]
    with pytest.raises(InvalidRequest):
        check_request(simple, made, LIMIT)
    del made.inputs[1].contents.int_contents[:]
    made.inputs[1].contents.fp32_contents.extend([1.0] * 16)  # the wrong list: says which
    wrong = r"go in contents\.int_contents; they came in contents\.fp32"
    with pytest.raises(InvalidRequest, match=wrong):
        check_request(simple, made, LIMIT)


DTYPES = load_catalog([Path(__file__).parents[1] / "catalogs" / "host_dtypes"]).pipelines


@pytest.mark.parametrize(
    ("target", "datatype", "contents", "values", "expected"),
    [
        ("dt.copy_i8", "INT8", "int_contents", [1, -2, 3, -128], np.int8),
        ("dt.copy_i16", "INT16", "int_contents", [1, -2, 3, 300], np.int16),
        ("dt.copy_u16", "UINT16", "uint_contents", [1, 2, 3, 65535], np.uint16),
        ("dt.copy_bool", "BOOL", "bool_contents", [True, False, True, True], np.bool_),
    ],
)
def test_typed_contents_of_every_type_a_list_carries(
    target: str, datatype: str, contents: str, values: list[object], expected: type
) -> None:
    """They failed INTERNAL (a KeyError: the table named the first seven types alone)."""
    made = pb.ModelInferRequest(model_name=target)
    getattr(made.inputs.add(name="x", datatype=datatype, shape=[4]).contents, contents).extend(
        values
    )
    checked = check_request(find_model(DTYPES, target, 0), made, LIMIT)
    assert checked.inputs[0].data == np.array(values, dtype=expected).tobytes()


def test_typed_contents_of_fp16_say_to_send_raw_bytes() -> None:
    made = pb.ModelInferRequest(model_name="dt.axpy_f16")
    for name in ("x", "y"):
        made.inputs.add(name=name, datatype="FP16", shape=[4]).contents.fp32_contents.extend(
            [1.0] * 4
        )
    with pytest.raises(InvalidRequest, match="raw_input_contents"):
        check_request(find_model(DTYPES, "dt.axpy_f16", 0), made, LIMIT)


def test_outputs_past_the_largest_message_are_refused() -> None:
    scan = request("accy.kernel.device_scan", ("x", "FP32", [1000], f32(1000)))
    with pytest.raises(InvalidRequest, match="shared memory"):
        check_request(model("accy.kernel.device_scan"), scan, 1000)


def test_peers() -> None:
    assert parse_peer("unix:").local and parse_peer("unix:").unix
    loop = parse_peer("ipv4:127.0.0.1:5000")
    assert loop.local and loop.port == 5000 and loop.address == ipaddress.IPv4Address("127.0.0.1")
    assert loop.socket_keys == (("0100007F", 5000), ("0000000000000000FFFF00000100007F", 5000))
    assert parse_peer("ipv6:[::1]:80").local
    assert parse_peer("ipv6:[::ffff:127.0.0.1]:80").local
    assert not parse_peer("ipv4:10.1.2.3:5000").local
    assert not parse_peer("garbage").local


def test_a_remote_caller_registers_no_system_memory() -> None:
    principal = Principal("t", frozenset({"launch"}), Quotas())
    remote = Owner(("t", "x"), "cli", principal, Peer("ipv4:10.0.0.1:1", False), models=None)  # type: ignore[arg-type]
    with pytest.raises(PermissionDenied):
        Owners(None, None).caller_uid(remote)  # type: ignore[arg-type]


def test_a_unix_caller_registers_memory_only_where_no_other_user_may_connect(
    tmp_path: Path,
) -> None:
    """gRPC names no Unix-socket caller: one let in by the socket's group must not register
    objects by the daemon's own user (it read and wrote a 0600 object that way)."""
    principal = Principal("t", frozenset({"launch"}), Quotas())
    local = Owner(("t", "unix:"), "cli", principal, Peer("unix:", True), models=None)  # type: ignore[arg-type]
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    sock = folder / "accyd.sock"
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(sock))
    os.chmod(sock, 0o660)
    owners = Owners(None, None, unix_sockets=(sock,))  # type: ignore[arg-type]
    modes = {parent: parent.stat().st_mode & 0o7777 for parent in [folder, *folder.parents]}
    try:
        assert owners.caller_uid(local) == os.geteuid()  # the folder shuts others out
        for parent, mode in modes.items():  # every folder above lets others through
            if parent.stat().st_uid == os.geteuid():
                os.chmod(parent, mode | 0o011)
        with pytest.raises(PermissionDenied, match="other users may connect"):
            owners.caller_uid(local)
        os.chmod(sock, 0o600)  # the socket itself shuts them out
        assert owners.caller_uid(local) == os.geteuid()
    finally:
        listening.close()
        for parent, mode in modes.items():
            if parent.stat().st_uid == os.geteuid():
                os.chmod(parent, mode)


def test_raw_contents_follow_the_requests_order_of_inputs() -> None:
    """``raw_input_contents`` are in the order the request lists its inputs: one that names
    ``simple``'s second operand first gives its bytes first (they once went to the first)."""
    zeros, ones = np.zeros(16, np.int32).tobytes(), np.ones(16, np.int32).tobytes()
    checked = check_request(
        model("simple"),
        request("simple", ("INPUT1", "INT32", [1, 16], ones), ("INPUT0", "INT32", [1, 16], zeros)),
        LIMIT,
    )
    by_name = {item.spec.name: item.data for item in checked.inputs}
    assert (by_name["INPUT0"], by_name["INPUT1"]) == (zeros, ones)


def test_the_tcp_table_is_searched_not_parsed(tmp_path: Path) -> None:
    """The owner of a loopback caller's end, from a table of 50,000 connections: found by
    its local address only (not where it is another line's remote end), only while open,
    and without splitting every line in Python (40 readings took seconds that way)."""
    import time

    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    line = "{n:6d}: {local} {remote} {st} 00000000:00000000 00:00000000 00000000  {uid}  0 1 1\n"
    rows = [
        line.format(n=i, local=f"0200007F:{i % 60000:04X}", remote="0100007F:0050", st="01", uid=7)
        for i in range(50_000)
    ]
    rows.append(line.format(n=1, local="0100007F:1F90", remote="0100007F:9C40", st="01", uid=42))
    rows.append(line.format(n=2, local="0100007F:9C41", remote="0100007F:0051", st="06", uid=43))
    table = tmp_path / "tcp"
    table.write_text(header + "".join(rows))
    read = TcpTable([table])
    assert read.owner(parse_peer("ipv4:127.0.0.1:8080")) == 42
    assert read.owner(parse_peer("ipv4:127.0.0.1:40000")) is None  # only a remote end there
    assert read.owner(parse_peer("ipv4:127.0.0.1:40001")) is None  # not established
    started = time.perf_counter()
    for _ in range(40):
        TcpTable([table]).owner(parse_peer("ipv4:127.0.0.1:8080"))
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(("priority", "lowered"), [(0, 0), (1, 0), (2, 1), (4, 3), (99, 5)])
def test_a_requests_priority_lowers_its_stream_below_its_tenants(
    priority: int, lowered: int
) -> None:
    """Triton's ``priority`` (0 the default, 1 the highest, larger lower) as levels below the
    tenant's stream priority: a request may lower its work, never raise it."""
    scan = request("accy.kernel.device_scan", ("x", "FP32", [8], f32(8)))
    scan.parameters["priority"].uint64_param = priority
    assert check_request(model("accy.kernel.device_scan"), scan, LIMIT).lowered == lowered


def test_a_priority_that_is_no_level_is_refused() -> None:
    scan = request("accy.kernel.device_scan", ("x", "FP32", [8], f32(8)))
    scan.parameters["priority"].int64_param = -1
    with pytest.raises(InvalidRequest, match="priority is 0"):
        check_request(model("accy.kernel.device_scan"), scan, LIMIT)
    scan.parameters["priority"].string_param = "high"
    with pytest.raises(InvalidRequest, match="priority"):
        check_request(model("accy.kernel.device_scan"), scan, LIMIT)


class _ChangingTable:
    """A socket table whose readings differ, as /proc/net/tcp's do when a live connection
    falls between two chunks of one reading."""

    def __init__(self, *readings: bytes) -> None:
        self.readings = list(readings)

    def read_bytes(self) -> bytes:
        return self.readings.pop(0)


_HEADER = b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
_ROW = b"   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000    42  0 1 1\n"


def test_a_loopback_caller_missed_by_one_reading_of_the_tcp_table_is_looked_up_again() -> None:
    """One miss must not make the caller a stranger to its own regions (perf_analyzer's
    inferences were refused the region its other connection registered)."""
    table = _ChangingTable(_HEADER, _HEADER + _ROW)
    peer = parse_peer("ipv4:127.0.0.1:40000")
    assert loopback_owner(peer, [table]) == 42  # type: ignore[list-item]
    assert not table.readings


def test_a_sweep_reading_sees_a_connection_either_of_its_readings_lists() -> None:
    """The sweep drops a client whose connections are all closed: a live one missed by one
    reading must still count as open."""
    table = _ChangingTable(_HEADER + _ROW, _HEADER)
    read = TcpTable([table], readings=2)  # type: ignore[list-item]
    assert read.owner(parse_peer("ipv4:127.0.0.1:40000")) == 42
    assert TcpTable([_ChangingTable(_HEADER)]).owner(parse_peer("ipv4:127.0.0.1:40000")) is None  # type: ignore[list-item]
