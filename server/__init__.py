"""The coordinator: gRPC service, job state machines, server-side protocol steps, `xclp-server` CLI."""
