"""A lost connection costs a reconnect, not the run (docs/operating.md "Long runs"): parties behind
a TCP proxy the test cuts mid-protocol (tests/proxy.py), through a real gRPC coordinator."""

from __future__ import annotations

import re
import time

import numpy as np

from tests.harness import PARTIES, allow_list, coordinator, job, party_data, run_parties
from tests.proxy import Proxy
from tests.service.test_allreduce import FLYNN, pooled_flynn
from xclp.client.connection import ConnectionConfig
from xclp.client.session import PartySession
from xclp.errors import XclpError


def test_connections_cut_mid_sum_are_resumed_and_the_aggregate_is_exact(keys) -> None:
    """Every party's connection is cut twice: right after the coordinator took b's masked counts
    (b's Push never hears its ack: it sends them again, and the coordinator takes them once) and
    right after it took a's reveal (the items on their way to the parties are sent again on the
    resumed streams). Nobody is dropped, no step restarts, and the aggregate is the pooled counts."""
    datas = {p: party_data(70 + i) for i, p in enumerate(PARTIES)}
    proxy: Proxy | None = None
    cut_at = {("sum", 0, "b"), ("sum_reveal", 0, "a")}

    def observe(job_id: str, step: str, attempt: int, sender: str, payload: object) -> None:
        if (step, attempt, sender) in cut_at and proxy is not None:
            proxy.cut()

    lines: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, reconnect_seconds=20.0)],
                     observer=observe) as (coord, address):
        proxy = Proxy(address)
        try:
            results = run_parties(address, "f", keys, datas, connection=ConnectionConfig(proxy.address, insecure=True),
                                  progress=lines)
        finally:
            proxy.close()
        run = coord.jobs["f"]
        assert run.stage.value == "done" and run.drop_reasons == {}, run.drop_reasons
    assert proxy.cuts >= 2
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert run.ledger["sum"].rounds == 1  # no restart: the cut cost no attempt
    pooled = pooled_flynn(results["a"].seed, datas)
    for p in PARTIES:
        assert results[p].participants == PARTIES and np.array_equal(results[p].aggregate, pooled)
        said = "\n".join(lines[p])
        assert "lost the connection to the coordinator" in said and "reconnected to the coordinator after" in said


def test_a_party_that_does_not_come_back_within_reconnect_seconds_is_dropped_and_the_sum_goes_on(keys) -> None:
    """b's network goes away as the sum starts and stays away: the coordinator keeps its place for
    reconnect_seconds, then drops it and the sum restarts among a and c; b gives up after the same
    window and says the connection was lost. Meanwhile `job show` says b's connection is lost."""
    datas = {p: party_data(80 + i) for i, p in enumerate(PARTIES)}
    shown: list[str] = []
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, reconnect_seconds=2.0)]) as (coord, address):
        proxy = Proxy(address)

        def b_as_shown() -> str:
            run = coord.jobs["f"]
            info = coord.run_info(run.run_id)
            return next(p.activity for p in info.parties if p.party_id == "b")

        class Unplugged(PartySession):
            def on_step(self, step):
                if step.step == "sum":
                    proxy.refuse()
                    give_up = time.monotonic() + 10
                    while not (activity := b_as_shown()).startswith("connection lost") and time.monotonic() < give_up:
                        time.sleep(0.02)
                    shown.append(activity)
                super().on_step(step)

        try:
            results = run_parties(address, "f", keys, datas, sessions={"b": Unplugged},
                                  connection={"b": ConnectionConfig(proxy.address, insecure=True)})
        finally:
            proxy.close()
        run = coord.jobs["f"]
        assert run.stage.value == "done"
        assert run.drop_reasons == {"b": "disconnected, and did not reconnect within 2 s"}
    assert isinstance(results["b"], XclpError), results["b"]
    assert shown and re.fullmatch(r"connection lost \d+ s ago; its place is kept for 2 s", shown[0]), shown
    assert results["a"].participants == ("a", "c")
    assert np.array_equal(results["c"].aggregate, pooled_flynn(results["a"].seed, {p: datas[p] for p in "ac"}))


def test_a_party_cut_off_while_it_waits_for_the_others_to_join_keeps_its_place(keys) -> None:
    """a and b have joined and wait for c; a's connection is cut and a comes back: it is still in the
    lobby when c joins, and the run goes on with all three. Before, a lost stream in the lobby took
    the party out of it at once, and its resumed stream was refused ("no open place")."""
    datas = {p: party_data(90 + i) for i, p in enumerate(PARTIES)}
    lines: dict[str, list[str]] = {}
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN, reconnect_seconds=20.0)]) as (coord, address):
        proxy = Proxy(address)

        def until(what: str, ready) -> None:
            give_up = time.monotonic() + 20
            while not ready():
                assert time.monotonic() < give_up, what
                time.sleep(0.02)

        class Late(PartySession):
            def run(self):  # c joins once a was cut off in the lobby and came back
                run = coord.jobs["f"]
                until("a and b joined", lambda: {"a", "b"} <= set(run.parties) and run.parties["a"].mailbox.streaming)
                proxy.cut()  # a resumes on a second stream (whether the coordinator saw the loss first or not)
                until("a back", lambda: run.parties["a"].mailbox.stream == 2 and run.parties["a"].lost_at is None)
                return super().run()

        try:
            results = run_parties(address, "f", keys, datas, sessions={"c": Late}, progress=lines,
                                  connection={"a": ConnectionConfig(proxy.address, insecure=True)})
        finally:
            proxy.close()
        run = coord.jobs["f"]
        assert run.stage.value == "done" and run.drop_reasons == {}, run.drop_reasons
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    assert results["a"].participants == PARTIES
    assert np.array_equal(results["a"].aggregate, pooled_flynn(results["a"].seed, datas))
    assert "reconnected to the coordinator after" in "\n".join(lines["a"])
