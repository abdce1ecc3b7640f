"""The daemon's own limits: what all tenants together may hold, and each tenant's default share.

Clients make more than device memory: each shared segment is a descriptor and
a mapping in the daemon, each ring four descriptors and up to a MiB, each
session a stream (a thread on the host backend). Unbounded, one tenant within
all its configured quotas could take the daemon to its descriptor limit (new
clients could not attach, status failed) or map terabytes. So every such
resource is counted twice: against the tenant (its quota, or where it has
none the default share below) and against the daemon's ceiling, which keeps
back a reserve for what no tenant is charged (listeners, connections, device
workers, the catalog). With no quota configured, no tenant can take more than
half of a ceiling, and all of them together never the reserve.
"""

from __future__ import annotations

import contextlib
import os
import resource
from dataclasses import dataclass

from accyd.core.tenants import Quotas

__all__ = [
    "CLIENTS_PER_TENANT",
    "DaemonLimits",
    "daemon_limits",
    "descriptor_limit",
    "raise_descriptor_limit",
    "shared_memory_default",
]

CLIENTS_PER_TENANT = 256
"""Clients one tenant may have attached at once, unless its quota says otherwise."""
CLIENTS_TOTAL = 4096
SESSIONS_PER_TENANT = 1024
SESSIONS_TOTAL = 4096
BUFFERS_PER_TENANT = 1 << 16
BUFFERS_TOTAL = 1 << 18
MOST_DESCRIPTORS = 1 << 20
"""The most descriptors the daemon asks for when it raises its own limit."""
SHARED_MEMORY_SHARE = 0.25
"""The share of physical memory the daemon shares with clients unless told another limit."""


def shared_memory_default() -> int:
    """``SHARED_MEMORY_SHARE`` of this machine's physical memory, in bytes."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * SHARED_MEMORY_SHARE)


@dataclass(frozen=True, slots=True)
class DaemonLimits:
    """What all tenants together may hold (``ceiling``) and each tenant by default."""

    ceiling: Quotas
    tenant_default: Quotas

    def defaults_for(self, configured: Quotas) -> Quotas:
        """Each tenant's defaults: the operator's default quota where given, else its share."""
        return Quotas(
            **{
                name: getattr(configured, name)
                if getattr(configured, name) is not None
                else getattr(self.tenant_default, name)
                for name in Quotas.__dataclass_fields__
            }
        )


def descriptor_limit() -> int:
    """This process's descriptor limit now (its soft ``RLIMIT_NOFILE``)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MOST_DESCRIPTORS if soft == resource.RLIM_INFINITY else int(soft)


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (at most ``MOST_DESCRIPTORS``), as a
    daemon that serves many clients should; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MOST_DESCRIPTORS if hard == resource.RLIM_INFINITY else min(hard, MOST_DESCRIPTORS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return descriptor_limit()


def daemon_limits(
    shared_memory_bytes: int | None = None, descriptors: int | None = None
) -> DaemonLimits:
    """The limits for a daemon that may share ``shared_memory_bytes`` of host memory with its
    clients and holds at most ``descriptors`` descriptors (its limit now, by default)."""
    total = descriptor_limit() if descriptors is None else descriptors
    if shared_memory_bytes is None:
        shared_memory_bytes = shared_memory_default()
    reserve = min(max(256, total // 4), total // 2)
    for_clients = total - reserve
    ceiling = Quotas(
        sessions=SESSIONS_TOTAL,
        buffers=BUFFERS_TOTAL,
        clients=CLIENTS_TOTAL,
        descriptors=for_clients,
        host_memory_bytes=shared_memory_bytes,
    )
    share = Quotas(
        sessions=SESSIONS_PER_TENANT,
        buffers=BUFFERS_PER_TENANT,
        clients=CLIENTS_PER_TENANT,
        descriptors=for_clients // 2,
        host_memory_bytes=shared_memory_bytes // 2,
    )
    return DaemonLimits(ceiling, share)
