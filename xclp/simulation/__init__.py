"""Whole protocols with every party and the coordinator in one process (tests, benchmarks).

- `run_xclp_inprocess` (xclp.simulation.xclp): one XCLP job, real cryptography, every message
  through the wire encoding;
- `run_fedavg` (xclp.simulation.fedavg): a federated training job round by round, the oracle of
  the service's parity test and what benchmarks/fedavg_xclp.py measures.
"""

from xclp.simulation.fedavg import FedavgRun, RoundRecord, run_fedavg
from xclp.simulation.xclp import InProcessResult, PartyOutput, RowSumsAttempt, run_xclp_inprocess

__all__ = ["FedavgRun", "InProcessResult", "PartyOutput", "RoundRecord", "RowSumsAttempt", "run_fedavg",
           "run_xclp_inprocess"]
