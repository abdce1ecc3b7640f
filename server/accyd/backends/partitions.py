"""SM partitions: what the operator asks for, how a device's SMs are dealt out, what was made.

A partition confines the kernels of the streams made in it to a share of one device's SMs
(on CUDA a green context; ``backends/cuda/partitions.py``). It is not a reservation: work
outside every partition still runs on all SMs, so partitions confine the tenants that must
be confined (a tenant that fills the GPU) and leave the rest on the whole device.

A device's SMs split in whole steps (8 SMs on Hopper): each partition gets its size rounded
down to a step, at least one step, in the order given, and together they must fit the
device. Where they cannot be made (the host backend, a driver without green contexts, too
many SMs asked for) the backend says why in ``SmSplit.unconfined`` and every stream is made
on the whole device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Partition", "PartitionSpec", "SmSplit", "deal_groups"]


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One named partition as the tokens file gives it: ``sms`` SMs or a ``share`` of each
    device's SMs (exactly one)."""

    name: str
    sms: int | None = None
    share: float | None = None

    def wanted(self, total: int) -> int:
        """SMs asked for on a device of ``total`` SMs."""
        if self.sms is not None:
            return self.sms
        return math.floor(total * (self.share or 0.0))

    def describe(self) -> str:
        return f"{self.sms} SMs" if self.sms is not None else f"{self.share:g} of the SMs"


@dataclass(frozen=True, slots=True)
class Partition:
    """A partition made on one device: its name and the SMs it got."""

    name: str
    sms: int


@dataclass(frozen=True, slots=True)
class SmSplit:
    """What a backend made of the specs: its partitions, or why it made none."""

    total_sms: int = 0
    partitions: tuple[Partition, ...] = ()
    unconfined: str = ""
    """Why no partition was made ("" when they were, or none was asked for)."""

    def sms_of(self, name: str) -> int | None:
        for partition in self.partitions:
            if partition.name == name:
                return partition.sms
        return None


def deal_groups(specs: Sequence[PartitionSpec], total: int, step: int) -> list[int]:
    """How many ``step``-SM groups each spec gets on a device of ``total`` SMs, in order:
    its size rounded down to a step, at least one; ``ValueError`` naming the sizes when they
    do not fit together."""
    if step <= 0 or total < step:
        raise ValueError(f"the device has {total} SMs, less than one step of {step}")
    counts = [max(spec.wanted(total) // step, 1) for spec in specs]
    available = total // step
    if sum(counts) > available:
        asked = ", ".join(
            f"{spec.name}: {count * step}" for spec, count in zip(specs, counts, strict=True)
        )
        raise ValueError(
            f"the partitions ask for {sum(counts) * step} SMs ({asked}), more than the "
            f"device's {available * step} in steps of {step}"
        )
    return counts
