"""The coordinator's protocol steps as pure functions (inputs -> outputs, no I/O).

The gRPC service (`server/*.py`) only moves, validates and routes bytes; the math of each job's
coordinator side lives here so it runs the same in one process (tests, `xclp/simulation.py`)
and behind the service (STYLE.md §2).
"""
