"""The party (`xclp.client`): dials the coordinator, runs its side of each job, `xclp-client` CLI.

From Python, `xclp.client.run(job=..., coordinator=..., identity=..., peers=..., data=df)` takes
part in one run and returns a `PartyResult` (client/api.py); `xclp-client run` is a thin layer
over it.

- `jobs/`: the party's state machine per job type after setup (`allreduce.AllReduceParty`,
  `xclp.XclpParty`); `session.PartySession` runs setup (roster, pairwise keys, common seed) and
  hands each later step and message to one of them. They move and check bytes, no math.
- `steps/`: the party's side of each protocol as pure functions (inputs -> outputs, no I/O), the
  same in the service and in `xclp.simulation`.
- `api`, `connection`, `models`, `outputs`, `cli`: the Python API, the gRPC channel, model files,
  what a party writes, the CLI.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xclp.client.api import PartyResult, run

__all__ = ["PartyResult", "run"]


def __getattr__(name: str) -> Any:
    # imported on first use: `import xclp.client.steps` (the simulation's way in) needs no gRPC
    if name in __all__:
        from xclp.client import api

        return getattr(api, name)
    raise AttributeError(f"module 'xclp.client' has no attribute {name!r}")
