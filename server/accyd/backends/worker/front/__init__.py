"""The daemon's side of a device worker: the backend proxy, its pool, the spawn."""
