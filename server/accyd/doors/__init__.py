"""The front doors onto the core facade: gRPC, the rings, KServe v2, host-shared memory."""
