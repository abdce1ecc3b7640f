"""The host backend's staging: slots in plain memory, its stream workers as the "DMA".

On the host backend a buffer is host memory already, so staging gains nothing
there; it runs anyway so that CI runs the very path a GPU's first copies of a
shared segment take (``accyd.backends.staging``): the chunks, the slots shared
by callers, the overlap of the host copies with the copy on the stream.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from accyd.backends.base import DeviceBuffer, Stream
from accyd.backends.host_streams import Fence, Worker
from accyd.backends.shared_ranges import SharedRanges, StagedCopies
from accyd.backends.staging import CHUNK_BYTES, SLOTS, LazyStaging, Staging

__all__ = ["host_staged_copies"]

_View = Callable[[DeviceBuffer, int, int], npt.NDArray[np.uint8]]


class _HostDma:
    """A slot's bytes to and from a buffer on the stream's worker thread, in its order."""

    def __init__(
        self,
        slots: list[npt.NDArray[np.uint8]],
        view: _View,
        worker: Callable[[Stream | None], Worker],
        alive: Callable[[], None],
    ) -> None:
        self._slots = slots
        self._view = view
        self._worker = worker
        self._alive = alive

    def to_device(
        self, slot: int, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None
    ) -> Fence:
        return self._copy(self._view(buffer, offset, size), self._slots[slot][:size], stream)

    def to_host(
        self, slot: int, buffer: DeviceBuffer, offset: int, size: int, stream: Stream | None
    ) -> Fence:
        return self._copy(self._slots[slot][:size], self._view(buffer, offset, size), stream)

    def _copy(
        self, target: npt.NDArray[np.uint8], source: npt.NDArray[np.uint8], stream: Stream | None
    ) -> Fence:
        worker = self._worker(stream)
        worker.submit(lambda: np.copyto(target, source))
        return worker.fence()

    def wait(self, token: Fence) -> None:
        token.synchronize()
        self._alive()


def host_staged_copies(
    view: _View, worker: Callable[[Stream | None], Worker], alive: Callable[[], None]
) -> StagedCopies:
    """The host backend's staged copies (its slots made at the first staged copy)."""

    def make() -> Staging[Fence]:
        slots = [np.zeros(CHUNK_BYTES, np.uint8) for _ in range(SLOTS)]
        views = [slot.data for slot in slots]
        return Staging(views, _HostDma(slots, view, worker, alive))

    return StagedCopies(SharedRanges(None, None), LazyStaging(make, background=False))
