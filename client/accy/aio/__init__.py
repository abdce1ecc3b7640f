"""accy.aio: the asyncio client, on ``grpc.aio``, with the blocking client's objects and errors.

::

    import accy.aio

    async with accy.aio.AsyncClient() as client:
        async with await client.load("accy.kernel.saxpy") as session:
            x = await client.buffer(np.ones(4, np.float32))
            ...
            await session.launch([x, y], [out], n=4, a=2.0)

Errors are ``accy.errors`` types, raised with the same messages as ``accy.Client``'s
for the same mistakes.
"""

from __future__ import annotations

from accy.aio._client import AsyncClient
from accy.aio._objects import AsyncBuffer, AsyncLaunch, AsyncSession

__all__ = ["AsyncBuffer", "AsyncClient", "AsyncLaunch", "AsyncSession"]
