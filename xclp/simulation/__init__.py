"""Whole protocols with every party and the coordinator in one process.

- `simulate` (xclp.simulation.simulate): a job over local tables with every role in one process,
  real cryptography or the plaintext reference, and what each role would learn — the way to try
  a federation before any institution is involved;

- `run_xclp_inprocess` (xclp.simulation.xclp): one XCLP job, real cryptography, every message
  through the wire encoding;
- `run_fedavg` (xclp.simulation.fedavg): a federated training job round by round, the oracle of
  the service's parity test and what benchmarks/fedavg_xclp.py measures;
- `run_dbcl` (xclp.simulation.dbcl): a dbcl job round by round, the oracle of its parity test and
  what benchmarks/dbcl.py measures;
- `pooled_scaling` (xclp.simulation.moments): the moments phase of a job that standardises or
  imputes, exact or with DP moments.
"""

from xclp.simulation.dbcl import DbclRound, DbclRun, run_dbcl
from xclp.simulation.fedavg import FedavgRun, RoundRecord, run_fedavg
from xclp.simulation.moments import pooled_scaling
from xclp.simulation.simulate import Simulation, simulate
from xclp.simulation.xclp import InProcessResult, PartyOutput, RowSumsAttempt, run_xclp_inprocess

__all__ = ["DbclRound", "DbclRun", "FedavgRun", "InProcessResult", "PartyOutput", "RoundRecord", "RowSumsAttempt",
           "Simulation", "pooled_scaling", "simulate", "run_dbcl", "run_fedavg", "run_xclp_inprocess"]
