"""The service layer: the only code that imports grpc (servicer, error mapping, conversions)."""
