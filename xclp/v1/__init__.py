"""The wire contract `xclp.v1`: generated protobuf/gRPC modules (from proto/, regenerate with
scripts/gen-proto) plus the small codec (`wire`) and error mapping (`status`) that the
coordinator and the parties share (docs/design.md §1, §3)."""
