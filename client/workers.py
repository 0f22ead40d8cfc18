"""Where a party's Paillier work runs (DESIGN §10.4): a local process pool by default."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Executor, ProcessPoolExecutor

from xclp.crypto.pool import default_workers


def make_executor(workers: int | None) -> Executor | None:
    """A process pool for Paillier work: `workers` processes (None = the cores), 0 = none.

    forkserver, not fork: the party already runs gRPC threads, and forking a threaded process
    can copy a held lock into the child.
    """
    if workers == 0:
        return None
    count = workers or default_workers()
    executor = ProcessPoolExecutor(max_workers=count, mp_context=multiprocessing.get_context("forkserver"))
    for _ in range(count):  # start the workers and their imports now, while the job is still joining
        executor.submit(_warm_up)
    return executor


def _warm_up() -> None:
    import xclp.crypto.secure_hamming  # noqa: F401 - the modules every Paillier task runs in
