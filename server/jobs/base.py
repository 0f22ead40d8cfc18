"""A job type on the coordinator: what Flower calls a Strategy (docs/architecture.md).

A `CoordinatorJob` is made for each run (`registry.get(type).coordinator_class()(config)`). It
adds the checks only its type needs to the run's admission, and gives the program of phases the
run executes after the seed and the preparation. It holds what its program computes (a model, a
graph) for the run's summary and for tests; the run holds everything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import numpy as np

from xclp.errors import InvalidInput
from xclp.server.config import JobConfig
from xclp.server.mailbox import Party
from xclp.server.phases.base import Program
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.params import JobParams

if TYPE_CHECKING:
    from xclp.server.run import Run


P = TypeVar("P", bound=JobParams)


class CoordinatorJob(Generic[P]):
    def __init__(self, config: JobConfig) -> None:
        self.config = config
        # the registry made this job for config.job_type, whose schema config.params is (config.py)
        self.params = cast(P, config.params)

    def check_summary(self, summary: pb.DataSummary) -> None:
        """Refuse (InvalidInput) a joining party whose data this job type cannot use."""

    def check_start(self, parties: Mapping[str, Party]) -> None:
        """Refuse (InvalidInput) the joined parties' data before any work: the job is REFUSED.
        By default: a job that needs labels, and no party brought one."""
        if self.config.params.needs_labels and not any(p.summary.labeled_rows for p in parties.values()):
            raise InvalidInput("no party brought a labeled row, so there is nothing to learn from: label some rows")

    def check_prepared(self, dim: int) -> None:
        """Refuse (InvalidInput) data that, as prepared (`dim` features), cannot run this job."""

    def program(self, run: Run) -> Program[str]:
        """The job's phases, after the seed and the preparation; returns what the parties hear at the end."""
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """What the job adds to the run summary (docs/design.md §9); nothing sensitive."""
        return {}

    def saved(self, run: Run) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """What a restarted coordinator needs to go on with `run` from where it is now (server/resume.py),
        or None where it cannot (the default: a run of this type ends as interrupted). Called under
        the run's lock: quick, and copies what it returns."""
        return None

    def resumed(self, run: Run, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> Program[str]:
        """The program's rest from what `saved` returned, in a restarted coordinator."""
        raise NotImplementedError
