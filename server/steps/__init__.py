"""The coordinator's protocol steps as pure functions (inputs -> outputs, no I/O).

The job state machines (`xclp.server.jobs`) only move, validate and route bytes; the math of each
job's coordinator side lives here so it runs the same in one process (tests, `xclp.simulation`)
and behind the service (STYLE.md §2).
"""
