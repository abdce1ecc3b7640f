"""The tokens file's SM partitions, and each tenant's partition and stream priority.

    [partitions.batch]         # or: [partitions]  batch = { sms = 64 }
    sms = 64                   # SMs of each GPU (rounded down to its step, 8 on Hopper)
    # share = 0.5              # or a share of each GPU's SMs

    [tenant.team-b]
    partition = "batch"        # its session streams' kernels run on those SMs only
    priority = 2               # 0 (default) to 5: higher runs first where the GPU has a choice

    [tenant.team-c]
    sm_share = 0.25            # a partition of its own: a quarter of each GPU's SMs

A partition confines; it reserves nothing (tenants without one run on the whole GPU).
Every value is checked here and a bad one refuses the whole file, naming the file, the
table and the field; whether the SMs asked for fit a GPU is the backend's to say at start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from accyd.backends.partitions import PartitionSpec
from accyd.core.tenants import Placement
from accyd.errors import CatalogError

__all__ = [
    "MAX_PRIORITY",
    "PLACEMENT_FIELDS",
    "check_shares",
    "own_partition",
    "read_partitions",
    "read_placement",
]

MAX_PRIORITY = 5
"""CUDA's priorities on current GPUs span six levels (0 to -5)."""
PLACEMENT_FIELDS = frozenset({"partition", "sm_share", "priority"})
"""A ``[tenant.NAME]`` table's fields that are not quotas."""
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
_Fail = Callable[[str, str], CatalogError]


def own_partition(tenant: str) -> str:
    """The name of the partition a tenant's ``sm_share`` makes (no table name has a dot)."""
    return f"tenant.{tenant}"


def _share(value: Any, fail: _Fail, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise fail(field, "must be a share of the GPU's SMs above 0 and below 1 (0.5: half)")
    return float(value)


def read_partitions(path: Path, raw: Any) -> dict[str, PartitionSpec]:
    """The ``[partitions]`` table: each partition's SMs or share of SMs."""
    if not isinstance(raw, Mapping):
        raise CatalogError(f"{path}: 'partitions' must hold one table per partition")
    found: dict[str, PartitionSpec] = {}
    for name, table in raw.items():
        where = f"[partitions.{name}]"

        def fail(field: str, problem: str, where: str = where) -> CatalogError:
            return CatalogError(f"{path}: {where}: field {field!r}: {problem}", field=field)

        if not _NAME.match(name):
            raise fail("name", "a partition's name is 1-48 letters, digits, '_' or '-'")
        if not isinstance(table, Mapping):
            raise fail(name, "must be a table: { sms = 64 } or { share = 0.5 }")
        unknown = set(table) - {"sms", "share"}
        if unknown:
            raise fail(sorted(unknown)[0], "is not a known field (sms, share)")
        if ("sms" in table) == ("share" in table):
            raise fail("sms", "give exactly one of sms (a count of SMs) and share (0 to 1)")
        if "sms" in table:
            sms = table["sms"]
            if isinstance(sms, bool) or not isinstance(sms, int) or sms <= 0:
                raise fail("sms", "must be a positive whole number of SMs")
            found[name] = PartitionSpec(name, sms=sms)
        else:
            found[name] = PartitionSpec(name, share=_share(table["share"], fail, "share"))
    return found


def read_placement(
    table: Mapping[str, Any], tenant: str, partitions: dict[str, PartitionSpec], fail: _Fail
) -> Placement | None:
    """A tenant's partition and priority from its table (``None``: neither given); its
    ``sm_share`` becomes a partition of its own, added to ``partitions``."""
    if not PLACEMENT_FIELDS & set(table):
        return None
    partition = table.get("partition")
    if partition is not None and "sm_share" in table:
        raise fail("sm_share", "give partition or sm_share, not both")
    if partition is not None and (not isinstance(partition, str) or partition not in partitions):
        known = ", ".join(sorted(n for n in partitions if "." not in n)) or "none"
        raise fail("partition", f"must name a table of [partitions] (defined: {known})")
    if "sm_share" in table:
        partition = own_partition(tenant)
        partitions[partition] = PartitionSpec(
            partition, share=_share(table["sm_share"], fail, "sm_share")
        )
    priority = table.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise fail("priority", f"must be a whole number from 0 to {MAX_PRIORITY}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise fail("priority", f"must be from 0 (the default) to {MAX_PRIORITY}")
    return Placement(partition, priority)


def check_shares(path: Path, partitions: Mapping[str, PartitionSpec]) -> None:
    """Refuse shares that add up to more than the whole GPU."""
    shares = {name: spec.share for name, spec in partitions.items() if spec.share is not None}
    if sum(shares.values()) > 1 + 1e-9:
        listed = ", ".join(f"{name} {share:g}" for name, share in shares.items())
        raise CatalogError(
            f"{path}: the partitions' shares add up to more than the whole GPU ({listed})",
            field="share",
        )
