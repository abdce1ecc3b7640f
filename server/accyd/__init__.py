"""accyd: the daemon that owns a node's GPUs and runs kernel pipelines for many clients."""

__version__ = "0.1.0"
