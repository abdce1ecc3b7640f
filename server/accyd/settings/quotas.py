"""The default quotas as settings: ``--quota-memory``, ``ACCYD_QUOTA_MEMORY_BYTES``..."""

from __future__ import annotations

from dataclasses import dataclass

from accyd.settings.fields import Bound, int_text, optional, setting, settings_of, size

__all__ = ["QUOTAS", "QUOTA_GROUP"]

QUOTA_GROUP = "default quotas (clients without a token; tenants that leave one out)"


@dataclass(frozen=True, slots=True)
class _QuotaSettings:
    """The default quotas as settings: ``--quota-memory``, ``ACCYD_QUOTA_MEMORY_BYTES``..."""

    memory_bytes: int | None = setting(
        None, "device memory", optional(size, "none"), flag="--quota-memory", metavar="BYTES",
        group=QUOTA_GROUP,
    )  # fmt: skip
    sessions: int | None = setting(
        None, "sessions", optional(int_text, "none"), flag="--quota-sessions", metavar="N",
        group=QUOTA_GROUP,
    )  # fmt: skip
    buffers: int | None = setting(
        None, "buffers", optional(int_text, "none"), flag="--quota-buffers", metavar="N",
        group=QUOTA_GROUP,
    )  # fmt: skip
    launches_in_flight: int | None = setting(
        None, "launches in flight", optional(int_text, "none"), flag="--quota-launches",
        metavar="N", group=QUOTA_GROUP,
    )  # fmt: skip
    clients: int | None = setting(
        None, "clients attached at once", optional(int_text, "none"), flag="--quota-clients",
        metavar="N", group=QUOTA_GROUP, shown_default="256",
    )  # fmt: skip
    descriptors: int | None = setting(
        None, "descriptors the daemon holds for the tenant (segments, rings, exports)",
        optional(int_text, "none"), flag="--quota-descriptors", metavar="N", group=QUOTA_GROUP,
        shown_default="half of what the daemon keeps for clients",
    )  # fmt: skip
    host_memory_bytes: int | None = setting(
        None, "host memory shared with the tenant's clients (segments, rings)",
        optional(size, "none"), flag="--quota-shared-memory", metavar="BYTES",
        group=QUOTA_GROUP, shown_default="half of --shared-memory-limit",
    )  # fmt: skip


QUOTAS: tuple[Bound, ...] = tuple(settings_of(_QuotaSettings, "QUOTA_"))
