"""The device worker process: it serves one backend over its channel."""
