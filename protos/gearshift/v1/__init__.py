"""Generated protobuf and gRPC code for the v1 contracts (see the .proto files beside it)."""
