"""A process pool for Paillier work (docs/design.md §5.3 "all Paillier work runs in a process pool").

Callers create the pool once (`process_pool()`) and pass it as `executor` to the protocol steps;
`run_tasks` also runs the same task functions in-process when `executor` is None (tests). Task
functions are module-level, take bytes/ints (cheap to pickle) and keep expensive per-key state
(fixed-base tables) in a per-process cache, so each worker builds a table once per key.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from xclp.runtime import default_workers

T = TypeVar("T")


@contextmanager
def process_pool(workers: int | None = None) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor sized to the cores, shut down on exit."""
    with ProcessPoolExecutor(max_workers=workers or default_workers()) as executor:
        yield executor


SHARED_BYTES = 64 << 10  # a bytes argument at least this large, given to several tasks, is shared


def run_tasks(fn: Callable[..., T], argument_tuples: Sequence[tuple[Any, ...]], executor: Executor | None) -> list[T]:
    """[fn(*args) for args in argument_tuples], on `executor` if given; results keep input order.

    An executor with a `share(value)` method (a cluster's, xclp/workers.py) gets each large bytes
    argument that several of the tasks take (the same object) once, and the tasks what it returns.
    """
    if executor is None:
        return [fn(*args) for args in argument_tuples]
    share = getattr(executor, "share", None)
    if share is not None:
        argument_tuples = _shared(argument_tuples, share)
    futures = [executor.submit(fn, *args) for args in argument_tuples]
    return [f.result() for f in futures]


def _shared(argument_tuples: Sequence[tuple[Any, ...]], share: Callable[[Any], Any]) -> list[tuple[Any, ...]]:
    large = [id(a) for args in argument_tuples for a in args if isinstance(a, bytes) and len(a) >= SHARED_BYTES]
    repeated = {i for i, uses in Counter(large).items() if uses > 1}  # the tuples keep the objects, so ids stay
    held: dict[int, Any] = {}

    def one(a: Any) -> Any:
        if id(a) not in repeated:
            return a
        if id(a) not in held:
            held[id(a)] = share(a)
        return held[id(a)]

    return [tuple(one(a) for a in args) for args in argument_tuples]
