"""Generated protobuf and gRPC code for the V2 gRPC service (scripts/gen_proto.sh); do not edit."""
