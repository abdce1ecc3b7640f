"""The shared-memory RPCs of the KServe door, over each caller's own regions.

System regions (``regions.py``) are registered only by callers on the daemon's
host and belong to the caller's client; a tenant holds at most
``MAX_TENANT_REGIONS`` of them over all its clients. Status and unregister see
the caller's regions alone: unregister-all drops only the caller's, and a
name of another client's is answered as an unknown one. CUDA regions (an IPC
handle is a bearer token: whoever sees it can open the memory) are refused
unless the operator turned them on (``cuda_regions.py``).
"""

from __future__ import annotations

from accyd.doors.kserve.cuda_regions import CudaRegions
from accyd.doors.kserve.owners import Owner, Owners
from accyd.doors.kserve.protocol import open_inference_pb2 as pb
from accyd.doors.kserve.regions import unknown_region
from accyd.errors import FailedPrecondition, QuotaExceeded
from accyd.scheduling import DeviceWork

__all__ = ["MAX_TENANT_REGIONS", "SharedMemory"]

MAX_TENANT_REGIONS = 256
"""The most system regions one tenant holds at once, over all its KServe clients."""

CUDA_OFF = (
    "CUDA shared memory is off on this daemon (an IPC handle lets whoever sees it open the "
    "memory): the operator turns it on with --kserve-cuda-shared-memory"
)


class SharedMemory:
    """Register, status and unregister of system and CUDA regions."""

    def __init__(self, owners: Owners, work: DeviceWork, cuda: CudaRegions | None) -> None:
        self.owners = owners
        self.work = work
        self.cuda = cuda

    async def register(self, owner: Owner, request: pb.SystemSharedMemoryRegisterRequest) -> None:
        uid = self.owners.caller_uid(owner)
        held = sum(len(o.regions) for o in self.owners.of_tenant(owner.tenant))
        if held >= MAX_TENANT_REGIONS:
            raise QuotaExceeded(
                f"tenant {owner.tenant!r} holds {held} shared-memory regions, the most it may: "
                "unregister some first",
                quota="shared_memory_regions",
            )
        await self.work.run_for(
            owner.client_id,
            owner.regions.register,
            request.name,
            request.key,
            request.offset,
            request.byte_size,
            uid,
        )

    @staticmethod
    def status(owner: Owner | None, name: str) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        if owner is None:
            if name:
                raise unknown_region(name)
            return response
        for found in owner.regions.status(name):
            response.regions[found.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=found.name, key=found.key, offset=found.offset, byte_size=found.byte_size
                )
            )
        return response

    @staticmethod
    def unregister(owner: Owner | None, name: str) -> None:
        if owner is not None:
            owner.regions.unregister(name)

    # CUDA ---------------------------------------------------------------------

    def _cuda(self) -> CudaRegions:
        if self.cuda is None:
            raise FailedPrecondition(CUDA_OFF, field="raw_handle")
        return self.cuda

    async def cuda_register(
        self, owner: Owner, request: pb.CudaSharedMemoryRegisterRequest
    ) -> None:
        cuda = self._cuda()
        self.owners.caller_uid(owner)  # local callers only, as for system regions
        await self.work.run_for(
            owner.client_id,
            cuda.register,
            owner.client_id,
            request.name,
            request.raw_handle,
            request.device_id,
            request.byte_size,
        )

    def cuda_status(self, owner: Owner | None, name: str) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        if self.cuda is None or owner is None:
            if name:
                raise FailedPrecondition(CUDA_OFF) if self.cuda is None else self.cuda.unknown(name)
            return response
        for found in self.cuda.status(owner.client_id, name):
            response.regions[found.name].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(
                    name=found.name, device_id=found.device_id, byte_size=found.byte_size
                )
            )
        return response

    async def cuda_unregister(self, owner: Owner | None, name: str) -> None:
        if self.cuda is not None and owner is not None:
            await self.work.run_for(owner.client_id, self.cuda.unregister, owner.client_id, name)
