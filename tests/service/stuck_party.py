"""A real party process that joins, takes the common seed, then hangs in the sum step.

Used by test_cli_e2e.py, which kills it with SIGKILL once it prints STALLING: a party dying
mid-job. Not part of the product.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.helpers import load_allow_list, load_identity
from xclp.client.connection import ConnectionConfig
from xclp.client.policy import PartyPolicy
from xclp.client.run_config import RunConfig
from xclp.client.session import PartySession
from xclp.data import tables as party_data


class Stuck(PartySession):
    def on_step(self, step):
        if step.step == "sum":
            print("STALLING", file=sys.stderr, flush=True)
            time.sleep(600)
        super().on_step(step)


def main() -> None:
    address, ca, job_id, party, key, data, peers = sys.argv[1:8]
    config = RunConfig(job_id, party, load_identity(Path(key)), ConnectionConfig(address, ca_cert=Path(ca)),
                       peers=load_allow_list(Path(peers)), policy=PartyPolicy(min_parties=2))
    Stuck(config, party_data.load(data), progress=lambda m: print(m, file=sys.stderr, flush=True)).run()


if __name__ == "__main__":
    main()
