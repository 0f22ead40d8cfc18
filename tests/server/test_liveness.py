"""The coordinator's news to the parties of a running run (server/liveness.py)."""

from __future__ import annotations

from xclp.server import liveness
from xclp.server.mailbox import Party
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.steps import RUN_ALIVE


def party(*capabilities: str) -> Party:
    return Party(None, None, pb.DataSummary(), capabilities=frozenset(capabilities))  # type: ignore[arg-type]


def items(p: Party) -> list[pb.PullItem]:
    out = []
    while (item := p.mailbox.get(0.0)) is not None:
        out.append(item)
    return out


def test_news_goes_every_news_seconds_to_the_parties_that_understand_it_and_says_only_the_step() -> None:
    new, old = party(RUN_ALIVE), party()  # old: a party of a version before RunAlive, which it cannot read
    parties = {"new": new, "old": old}
    started = 1000.0
    liveness.news(parties, started + liveness.NEWS_SECONDS - 1, started, "influence")
    assert not items(new)  # not within the first NEWS_SECONDS of the run
    liveness.news(parties, started + liveness.NEWS_SECONDS, started, "influence")
    [item] = items(new)
    assert item.alive == pb.RunAlive(step="influence", seconds=liveness.NEWS_SECONDS)
    liveness.news(parties, started + 1.5 * liveness.NEWS_SECONDS, started, "influence")
    assert not items(new)  # told NEWS_SECONDS / 2 ago
    liveness.news(parties, started + 2 * liveness.NEWS_SECONDS, started, "")
    assert [i.alive.step for i in items(new)] == [""]
    assert not items(old)
