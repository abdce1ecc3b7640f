"""One CUDA device's SM partitions as green contexts, made once and destroyed with the backend.

The device's SM resource is split once into groups of the smallest step it allows (8 SMs
on Hopper: ``minSmPartitionSize``); each partition takes its share of whole groups, in
order, as one descriptor (groups of one split may be combined) and one green context.
Its streams are ``cuGreenCtxStreamCreate`` streams: the primary context's kernels, graphs,
buffers and events work on them (checked on an H200), and their blocks run on the
partition's SMs only. Nothing is made current: launches go through the streams.

Where green contexts cannot be made (cuda-bindings or the driver older than CUDA 12.4,
too many SMs asked for, a driver call refused) the split says why and nothing is left
made: every stream then runs on the whole device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from accyd.backends.cuda.driver import ErrorCheck
from accyd.backends.partitions import Partition, PartitionSpec, SmSplit, deal_groups
from accyd.errors import AccyError, FailedPrecondition, UnsupportedOperation

__all__ = ["GREEN_CONTEXT_DRIVER", "GreenContexts"]

GREEN_CONTEXT_DRIVER = 12040
"""The first driver (CUDA 12.4) with ``cuDevSmResourceSplitByCount`` and green contexts."""
_CALLS = (
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxStreamCreate",
    "cuGreenCtxDestroy",
)


class GreenContexts:
    """The green contexts of one device's partitions, by name."""

    def __init__(self) -> None:
        self.split = SmSplit()
        self._contexts: dict[str, Any] = {}
        self._asked = False

    def make(
        self,
        cu: Any,
        check: ErrorCheck,
        device: Any,
        driver_version: int,
        specs: Sequence[PartitionSpec],
    ) -> SmSplit:
        """Split the device's SMs into ``specs``' partitions (once)."""
        if self._asked:
            raise FailedPrecondition("this device's SMs were split already (once, at start)")
        self._asked = True
        missing = [name for name in _CALLS if not hasattr(cu, name)]
        if missing:
            why = f"cuda-bindings has no {missing[0]} (green contexts need CUDA 12.4 or later)"
            return self._unconfined(0, why)
        if driver_version < GREEN_CONTEXT_DRIVER:
            major, minor = divmod(driver_version // 10, 100)
            why = f"the driver supports CUDA {major}.{minor}; green contexts need 12.4 or later"
            return self._unconfined(0, why)
        total = 0
        try:
            sm_type = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
            resource = check(cu.cuDeviceGetDevResource(device, sm_type), "cuDeviceGetDevResource")
            total = int(resource.sm.smCount)
            step = max(int(resource.sm.minSmPartitionSize), 1)
            counts = deal_groups(specs, total, step)
            groups, made, _ = check(
                cu.cuDevSmResourceSplitByCount(total // step, resource, 0, step),
                "cuDevSmResourceSplitByCount",
            )
            if int(made) < sum(counts):
                raise ValueError(
                    f"the driver made {int(made)} groups of {step} SMs, the partitions need "
                    f"{sum(counts)}"
                )
            partitions = []
            at = 0
            for spec, count in zip(specs, counts, strict=True):
                parts = list(groups[at : at + count])
                at += count
                desc = check(
                    cu.cuDevResourceGenerateDesc(parts, count), "cuDevResourceGenerateDesc"
                )
                flags = cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
                green = check(cu.cuGreenCtxCreate(desc, device, flags), "cuGreenCtxCreate")
                self._contexts[spec.name] = green
                partitions.append(Partition(spec.name, sum(int(p.sm.smCount) for p in parts)))
        except (AccyError, ValueError) as error:
            self.close(cu)
            return self._unconfined(total, str(error))
        self.split = SmSplit(total, tuple(partitions))
        return self.split

    def _unconfined(self, total: int, why: str) -> SmSplit:
        self.split = SmSplit(total, unconfined=why)
        return self.split

    def stream(self, cu: Any, check: ErrorCheck, name: str, priority: int) -> Any:
        """A non-blocking stream in partition ``name`` (CUDA's priority: lower runs first)."""
        green = self._contexts.get(name)
        if green is None:
            raise UnsupportedOperation(f"no SM partition {name!r} was made on this device")
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        return check(cu.cuGreenCtxStreamCreate(green, flags, priority), "cuGreenCtxStreamCreate")

    def close(self, cu: Any) -> None:
        """Destroy the green contexts (after their streams); best effort, idempotent."""
        contexts, self._contexts = list(self._contexts.values()), {}
        for green in contexts:
            cu.cuGreenCtxDestroy(green)
