"""The KServe v2 HTTP/REST door: the gRPC door's service, reached over HTTP with JSON."""
