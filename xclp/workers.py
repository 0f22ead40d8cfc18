"""Where a party's Paillier work runs (docs/design.md §10.4): a local process pool by default, or the
institution's own Dask distributed cluster (`--workers tls://scheduler:8786`). It sits below both
ends (docs/design.md §1): the coordinator's influence solve uses the same cluster connection
(server/offload.py, §10.8).

Every Paillier task (encrypt a batch of A's bit slices, evaluate a batch against some of B's rows,
decrypt a chunk) goes through a `concurrent.futures.Executor` (crypto/pool.py `run_tasks`):
- a number: that many local processes (forkserver, not fork: the party already runs gRPC threads,
  and forking a threaded process can copy a held lock into the child), started at the first
  Paillier task rather than at Join (`LocalPool`); 0: none, in-process;
- a scheduler address: a `distributed.Client` of the institution's cluster. Its tasks carry the
  party's Paillier secret key (A decrypts on the workers) and its codes, so the address must be
  one of the institution's own machines: TLS only (mutual, configured the Dask way:
  `distributed.comm.tls.ca-file`, `...tls.client.cert`, `...tls.client.key` in Dask's YAML config
  or the DASK_DISTRIBUTED__COMM__TLS__* environment variables), `tcp://` only when the party was
  told `--insecure-workers`. The party connects before it joins a job, so a scheduler that does
  not answer, or does not speak TLS, refuses the job before Join.

On the cluster, an argument of a task that other tasks of the same call share (a batch of A's
ciphertexts that B's evaluation splits over its rows) is sent to the cluster once, as a task of
its own that the scheduler can recompute if the worker holding it is lost (scattered data could
not be), and the tasks depend on it. A worker lost mid-task is survived by Dask's own retry
(`distributed.scheduler.allowed-failures`); a lost scheduler fails the party's step with a
`WorkersLost` that names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from xclp.errors import ConfigError, XclpError
from xclp.runtime import default_workers

log = logging.getLogger("xclp.workers")

T = TypeVar("T")

SCHEMES = ("tls", "tcp")
CONNECT_SECONDS = 20.0  # how long the party waits for the scheduler before refusing the job
THREADS_SECONDS = 5.0  # how stale the cluster's thread count may be
TLS_KEYS = ("distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert", "distributed.comm.tls.client.key")


class WorkersLost(XclpError):
    """The Dask cluster doing this party's Paillier work went away mid-step."""


@dataclass(frozen=True)
class WorkerSpec:
    """`--workers`: local processes (`processes`, None = the cores) or a Dask scheduler address."""

    processes: int | None = None
    scheduler: str | None = None

    @classmethod
    def parse(cls, value: int | str | None, *, insecure: bool = False, given: str = "--workers",
              insecure_given: str = "--insecure-workers",
              carries: str = "Paillier tasks carry this party's secret key and codes") -> WorkerSpec:
        """A number of processes or a scheduler address; ConfigError with what to do otherwise,
        naming the settings the way they were given (client/options.py) and what the tasks carry."""
        if value is None:
            return cls()
        text = str(value).strip()
        if text.isdigit():
            return cls(processes=int(text))
        scheme = urlsplit(text).scheme if "://" in text else ""
        if scheme not in SCHEMES or not urlsplit(text).hostname:
            raise ConfigError(f"{given} {text!r}: give a number of local processes or a Dask scheduler address "
                              "tls://host:port")
        if scheme == "tcp" and not insecure:
            raise ConfigError(f"{given} {text}: {carries}, and tcp:// "
                              "sends them in the clear; use tls:// (mutual TLS configured the Dask way, "
                              "docs/cluster.md), "
                              f"or set {insecure_given} on a network nobody else can read")
        return cls(scheduler=text)

    def __str__(self) -> str:
        if self.scheduler is not None:
            return self.scheduler
        return "the cores" if self.processes is None else str(self.processes)


def make_executor(spec: WorkerSpec | int | None) -> Executor | None:
    """Where this party's Paillier tasks run (module docstring); None: in-process."""
    if not isinstance(spec, WorkerSpec):
        spec = WorkerSpec(processes=spec)
    if spec.scheduler is not None:
        return DaskWorkers.connect(spec.scheduler)
    if spec.processes == 0:
        return None
    return LocalPool(spec.processes or default_workers())


class LocalPool(Executor):
    """A local process pool that starts at the first Paillier task, not at Join: a
    coordinator that gets an agent to join many runs, or a run that never reaches SecureHamming,
    costs no processes. Thread-safe; `shutdown` ends the processes if any started."""

    def __init__(self, processes: int) -> None:
        self._max_workers = processes  # worker_count reads it
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._unfinished: set[Future[Any]] = set()

    @property
    def started(self) -> bool:
        return self._pool is not None

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        # under the lock: the first submit starts the worker processes, and a shutdown from another
        # thread (the agent stopping) must find every one of them to end, not a pool half started
        with self._lock:
            if self._closed:
                raise RuntimeError("the Paillier pool was shut down")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self._max_workers,
                                                 mp_context=multiprocessing.get_context("forkserver"),
                                                 initializer=die_with_party, initargs=(os.getpid(),))
            future = self._pool.submit(fn, *args, **kwargs)
            self._unfinished.add(future)
        future.add_done_callback(self._unfinished.discard)
        return future

    def abandon(self) -> bool:
        """The work in flight is for a step attempt that is over (a restart began while this party
        evaluated or decrypted a piece): end the workers now, mid-task, rather than let them finish
        what nobody will read (at 3 x 4 000 rows, 16-34 s of both cores after each restart). Its
        tasks fail (BrokenProcessPool); the next task starts a new pool. Whether anything was ended."""
        with self._lock:
            pool = self._pool
            if pool is None or self._closed or not self._unfinished:
                return False
            self._pool = None
        _terminate(pool)
        pool.shutdown(wait=False, cancel_futures=True)
        return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """With cancel_futures (the party stops: an error, a cancelled run, SIGTERM) the workers are
        ended now, mid-task, rather than left to finish Paillier work nobody will read."""
        with self._lock:
            self._closed, pool, self._pool = True, self._pool, None
        if pool is None:
            return
        if cancel_futures:
            _terminate(pool)
        pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def _terminate(pool: ProcessPoolExecutor) -> None:
    """End a pool's workers now, mid-task."""
    # the queue's feeder may be blocked writing a task (megabytes of ciphertexts) into a pipe that no
    # worker reads any more: it must not hold the process's exit (CPython joins it)
    call_queue = getattr(pool, "_call_queue", None)
    if call_queue is not None:
        call_queue.cancel_join_thread()
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


def die_with_party(party: int) -> None:
    """In a pool worker: end when the party process `party` ends, whatever ends it. A party killed
    with SIGKILL runs no `finally`; its workers, children of its forkserver, then stayed under init
    for good (blocked on a task queue whose writer they hold themselves, and keeping the forkserver
    and the resource tracker alive with them). A thread waits on the party's pidfd (Linux 5.3+) and
    ends the worker the moment the party is gone, mid-task or idle. Ctrl-C in the party's terminal
    reaches its workers too: they leave it to the party, which ends them (each printed a bare
    "Process ForkServerProcess-1:" traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        handle = os.pidfd_open(party)
    except ProcessLookupError:  # gone before the worker started
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here: the party's own shutdown ends its workers
        return

    def watch() -> None:
        select.select([handle], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="xclp-party-watch", daemon=True).start()


def worker_count(executor: Executor | None) -> int:
    """How many Paillier tasks run at once: the pool's processes, or the cluster's worker threads."""
    if executor is None:
        return 1
    if isinstance(executor, DaskWorkers):
        return executor.threads()
    return max(1, int(getattr(executor, "_max_workers", 1)))


def _hold(value: T) -> T:
    """A shared task argument as a task of its own (the scheduler can recompute it)."""
    return value


class DaskWorkers(Executor):
    """The institution's Dask cluster as an Executor (module docstring)."""

    def __init__(self, client: Any, address: str, work: str = "Paillier work") -> None:
        from distributed import KilledWorker
        from distributed.comm.core import CommClosedError

        self.client, self.address, self.work = client, address, work
        self._threads, self._asked = 1, -THREADS_SECONDS
        self._lock = threading.Lock()
        self._unfinished: dict[str, tuple[Any, Future[Any]]] = {}  # key -> (the cluster's future, ours)
        # what the cluster, not the task, raises: cancelled (scheduler lost), retried out, comm down
        self.lost: tuple[type[BaseException], ...] = (CancelledError, asyncio.CancelledError, KilledWorker,
                                                      CommClosedError, OSError, TimeoutError)

    @classmethod
    def connect(cls, address: str, timeout: float | None = None, *, work: str = "Paillier work") -> DaskWorkers:
        """The scheduler at `address`, for `work` (what the log says runs there); ConfigError if it
        does not answer within `timeout` (CONNECT_SECONDS)."""
        timeout = CONNECT_SECONDS if timeout is None else timeout
        try:
            import dask
            from distributed import Client
        except ImportError:
            raise ConfigError(f"--workers {address}: Dask is not installed; pip install 'xclp[dask]'") from None
        if address.startswith("tls://"):
            missing = [key for key in TLS_KEYS if not dask.config.get(key, None)]
            if missing:
                raise ConfigError(f"--workers {address}: mutual TLS needs Dask's {', '.join(missing)} (Dask's YAML "
                                  f"config, or {', '.join(_env(key) for key in missing)}; docs/cluster.md)")
        try:
            client = Client(address, timeout=timeout, set_as_default=False)
        except Exception as exc:  # refused, timed out, a TLS handshake with a plain-TCP server, a bad TLS file
            raise ConfigError(f"--workers {address}: the Dask scheduler did not answer within {timeout:.0f} s "
                              f"({_reason(exc)}); is it up, does it speak {address.split(':')[0]}, and do its "
                              "certificates come from the CA in Dask's distributed.comm.tls.ca-file?") from None
        workers = cls(client, address, work)
        log.info("%s", workers.describe())
        return workers

    def describe(self) -> str:
        """Which scheduler and how many workers (no secrets), for the party's log."""
        return (f"{self.work} on the Dask scheduler {self.address}: {len(self._nthreads())} workers, "
                f"{self.threads()} threads")

    def threads(self) -> int:
        """The cluster's worker threads (at least 1), asked of the scheduler at most every few seconds."""
        now = time.monotonic()
        if now - self._asked >= THREADS_SECONDS:
            self._threads, self._asked = max(1, self.connected_threads()), now
        return self._threads

    def connected_threads(self) -> int:
        """The cluster's worker threads now (0 with no worker); WorkersLost if the scheduler is gone."""
        return sum(self._nthreads().values())

    def _nthreads(self) -> dict[str, int]:
        try:
            return dict(self.client.nthreads())
        except Exception as exc:
            raise WorkersLost(f"the Dask scheduler {self.address} is gone: {_reason(exc)}") from None

    def share(self, value: T) -> Any:
        """`value` sent to the cluster once, for several tasks to take (crypto/pool.py run_tasks)."""
        return self.client.submit(_hold, value, pure=False)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            remote = self.client.submit(fn, *args, pure=False, **kwargs)
        except Exception as exc:
            done.set_exception(WorkersLost(f"the Dask scheduler {self.address} is gone: {_reason(exc)}"))
            return done

        with self._lock:
            self._unfinished[remote.key] = (remote, done)

        def settle(remote: Any) -> None:
            with self._lock:  # whoever takes it out settles ours: this callback, or `abandon`
                if self._unfinished.pop(remote.key, None) is None:
                    return
            try:
                value = remote.result()
            except self.lost as exc:
                done.set_exception(WorkersLost(f"a Paillier task on the Dask scheduler {self.address} failed: "
                                               f"{_reason(exc)}"))
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(value)

        remote.add_done_callback(settle)
        return done

    def abandon(self) -> bool:
        """The work in flight is for a step attempt that is over (LocalPool.abandon's reason): the
        cluster drops its queued tasks (a task a worker runs now cannot be interrupted there and
        finishes unread), and each task fails here at once with CancelledError. Whether anything was
        abandoned."""
        with self._lock:
            unfinished, self._unfinished = list(self._unfinished.values()), {}
        if not unfinished:
            return False
        with contextlib.suppress(Exception):  # a scheduler gone already has nothing left to run
            self.client.cancel([remote for remote, _ in unfinished])
        for _, done in unfinished:
            done.set_exception(CancelledError("a later attempt began: this task's work is abandoned"))
        return True

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with contextlib.suppress(Exception):  # the scheduler may be gone already; nothing to keep
            self.client.close(timeout=5 if wait else 1)


def _env(key: str) -> str:
    return "DASK_" + key.upper().replace(".", "__").replace("-", "_")


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

