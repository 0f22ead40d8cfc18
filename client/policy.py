"""A party's own security policy, checked by the party whatever the coordinator or the job file
say (docs/design.md §2.3-2.4). The coordinator may be active: it may send any job spec and any schedule.

- `check_job`, on the spec from the Challenge, before the party joins: enough parties, the DP the
  party requires (of its rows, --require-dp; of its labels, --require-label-dp), no hidden label
  mask unless allowed, no DBCL layer released unsketched unless allowed, no DBCL without
  record-level DP unless allowed (--allow-non-dp-dbcl), Paillier keys of a secure size, a share
  threshold no lower than the party's (`--min-share-threshold`).
- `check_step`, on every StepStart: at least `min_parties` participants (but in a masked sum's
  recover step, whose sum is over the attempt's larger set), always including this party; a later
  attempt of a step only with a strictly smaller participant set (a restart after a dropout; a
  repeated or grown set could be used to difference sums), but SecureHamming's, a training round's
  update sum and SecureRowSums (with their confirm steps), which may also keep their set (a
  coordinator that restarted, or a member whose process restarted, goes on
  with them: each SecureHamming attempt releases, under fresh masks, only distances the coordinator
  learns in any case; each attempt of those two sums masks the same value, noise included, under
  fresh masks, and the party opens one attempt only, the latest it masked, never after revealing
  (client/phases/masked_sum.py), so the attempts it left are dead to it; at most 3 times per sum;
  and XCLP's labeled rows, the same row numbers sent again, which tell nothing new); nothing after
  the result.
  (An attempt travels in the wire's `round` field.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from xclp.client.options import OPTIONS, default, flag_name, value
from xclp.crypto.paillier import MIN_SECURE_BITS
from xclp.errors import ConfigError, PolicyRefused, ProtocolError
from xclp.v1 import xclp_pb2 as pb
from xclp.v1.double_masking import CONFIRM_SUFFIX, RECOVER_SUFFIX, recoverable, share_threshold
from xclp.v1.params import JobParams
from xclp.v1.training import UPDATE_STEP
from xclp.v1.xclp import HAMMING_STEP, LABELS_STEP, ROWSUMS_STEP

# steps a restarted coordinator goes on with among the same parties (the module docstring says why);
# the labeled rows, which are no sum, are sent again as they were (hence steps, not sums)
SAME_SET_STEPS = (UPDATE_STEP, ROWSUMS_STEP, LABELS_STEP)
RESUMABLE_STEPS = (HAMMING_STEP, *SAME_SET_STEPS)
# how many times such a step may go on among the same parties: as often as its coordinator may
# restart in one sum, not forever (a coordinator restarting it in a loop only costs the party work)
MAX_SAME_SET = 3


@dataclass(frozen=True)
class PartyPolicy:
    # the defaults and the meanings are the options' (client/options.py)
    min_parties: int = default("min_parties")  # the smallest participant set this party masks with
    require_dp: float | None = default("require_dp")  # if set: only DP jobs with epsilon <= this
    require_label_dp: float | None = default("require_label_dp")  # if set: labels spend epsilon <= this
    allow_hide_label_mask: bool = default("allow_hide_label_mask")  # hands peers S[:, R_j] (docs/design.md §5.5)
    insecure_test_keys: bool = default("insecure_test_keys")  # Paillier keys below 2048 bits (tests only)
    min_share_threshold: int = default("min_share_threshold")  # the fewest shares that rebuild a self-mask seed
    allow_unsketched_layers: bool = default("allow_unsketched_layers")  # DBCL layers released unsketched
    allow_non_dp_dbcl: bool = default("allow_non_dp_dbcl")  # DBCL without record-level DP
    # how the user gave each setting, for the refusals (a flag, a TOML key, a keyword)
    named: Callable[[str], str] = field(default=flag_name, compare=False, repr=False)

    def __post_init__(self) -> None:
        """The bounds of client/options.py, for a policy made in Python (a setting given by a user
        was read there first, and named the way it was given)."""
        for name in ("min_share_threshold", "min_parties", "require_dp", "require_label_dp"):
            try:
                OPTIONS[name].read(getattr(self, name), self.named(name))
            except ConfigError as exc:
                raise PolicyRefused(str(exc)) from None

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], named: Callable[[str], str] = flag_name) -> PartyPolicy:
        """The policy from settings read by `options.read_settings` (`xclp-client run`'s, the API's
        or an agent's [policy] table: the same names); the rest are the options' defaults.
        `named(option)`: how the user gave it, which a refusal says."""
        return cls(**{f.name: value(settings, f.name) for f in fields(cls) if f.name != "named"}, named=named)

    def check_job(self, spec: pb.JobSpec, params: JobParams) -> None:
        """Refuse, before joining, a job this party will not take part in."""
        if len(spec.expected_parties) < self.min_parties:
            raise PolicyRefused(f"job {spec.job_id!r} expects {len(spec.expected_parties)} parties; this party masks "
                                f"with at least {self.min_parties} ({self.named('min_parties')})")
        if self.require_dp is not None:
            epsilon = params.epsilon_total
            if epsilon is None and params.release_epsilon is not None:
                raise PolicyRefused(f"job {spec.job_id!r} standardises or imputes without DP, which releases the "
                                    "pooled mean and standard deviation of every feature exactly, outside the DP "
                                    f"guarantee that {self.named('require_dp')} asks for (docs/design.md §8; the job "
                                    "can set moments_epsilon)")
            if epsilon is None:
                labels_only = (" (its label-DP protects labels only, not the rows: see "
                               f"{self.named('require_label_dp')})" if params.label_epsilon_total is not None else "")
                raise PolicyRefused(f"this party requires DP with epsilon <= {self.require_dp} "
                                    f"({self.named('require_dp')}), and job {spec.job_id!r} ({spec.job_type}) "
                                    f"releases without DP{labels_only}")
            if epsilon > self.require_dp:
                moments = (f" ({params.release_epsilon:g} for its releases and {params.moments_epsilon:g} for the "
                           "moments)" if params.moments_dp else "")
                raise PolicyRefused(f"job {spec.job_id!r} spends epsilon = {epsilon:g} in total over its "
                                    f"releases{moments}; this party requires epsilon <= {self.require_dp:g} "
                                    f"({self.named('require_dp')})")
        if self.require_label_dp is not None:
            epsilon = params.label_epsilon_total
            if epsilon is None:
                raise PolicyRefused(f"this party requires label-DP with epsilon <= {self.require_label_dp} "
                                    f"({self.named('require_label_dp')}), and job {spec.job_id!r} ({spec.job_type}) "
                                    "releases what "
                                    "its labels say without DP (xclp: set label_dp_epsilon)")
            if epsilon > self.require_label_dp:
                raise PolicyRefused(f"job {spec.job_id!r} spends epsilon = {epsilon:g} on each label; this party "
                                    f"requires epsilon <= {self.require_label_dp:g} "
                                    f"({self.named('require_label_dp')})")
        if params.hides_labeled_rows and not self.allow_hide_label_mask:
            raise PolicyRefused(f"job {spec.job_id!r} hides the label mask, which hands every party the influence "
                                "of all its rows, from which peers can solve for labels (docs/design.md §5.5); "
                                f"take part only with {self.named('allow_hide_label_mask')}")
        unsketched = params.unsketched_layers
        if unsketched and not self.allow_unsketched_layers:
            raise PolicyRefused(f"job {spec.job_id!r} releases the gradients of layer(s) "
                                f"{', '.join(map(str, unsketched))} unsketched, from which a property probe tells "
                                "what the other parties' batches held (docs/jobs/dbcl.md); sketch every layer, or take "
                                f"part only with {self.named('allow_unsketched_layers')}")
        differenced = params.differenced_without_dp
        if differenced and not self.allow_non_dp_dbcl:
            raise PolicyRefused(f"job {spec.job_id!r} ({spec.job_type}) runs without record-level DP: {differenced}. "
                                "Set dp_epsilon in the job, or take part only with "
                                f"{self.named('allow_non_dp_dbcl')} (docs/jobs/dbcl.md)")
        self.check_threshold(params.share_threshold, len(spec.expected_parties), f"job {spec.job_id!r}")
        keys = params.paillier
        if keys is not None and keys.bits < MIN_SECURE_BITS and not self.insecure_test_keys:
            raise PolicyRefused(f"job {spec.job_id!r} uses {keys.bits}-bit Paillier keys, below the secure "
                                f"{MIN_SECURE_BITS}; that is for tests only ({self.named('insecure_test_keys')})")

    def check_threshold(self, configured: int, holders: int, what: str) -> None:
        check_share_threshold(configured, holders, self.min_share_threshold, what,
                              self.named("min_share_threshold"))


def check_share_threshold(configured: int, holders: int, minimum: int, what: str,
                          setting: str = "--min-share-threshold") -> None:
    """Refuse (PolicyRefused) a sum among `holders` whose seeds the threshold `configured` would let
    fewer than `minimum` shares rebuild (a sum nobody can be recovered from shares nothing): the job
    at Join, each attempt before masking (client/phases/seed_shares.py)."""
    t = share_threshold(configured, holders)
    if recoverable(t, holders) and t < minimum:
        raise PolicyRefused(f"{what} lets {t} of {holders} parties rebuild a self-mask seed; this party requires "
                            f"at least {minimum} ({setting})")


@dataclass
class StepGuard:
    """What this party has answered so far, to refuse a schedule it must not follow (docs/design.md §2.4)."""

    policy: PartyPolicy
    party_id: str
    last: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)  # step -> (attempt, participants)
    kept_sets: dict[str, int] = field(default_factory=dict)  # SAME_SET_STEPS step -> restarts among the same parties
    finished: bool = False  # the job's result has arrived
    job_min_parties: int = 0  # what the job allows (its spec), to say which setting decided

    def saved(self) -> dict[str, list[Any]]:
        """The steps answered, for a restart (client/run_state.py): a restarted party is held to them."""
        return {step: [attempt, sorted(members)] for step, (attempt, members) in self.last.items()}

    def restore(self, saved: Mapping[str, list[Any]]) -> None:
        self.last = {step: (int(attempt), frozenset(members)) for step, (attempt, members) in saved.items()}

    def check_step(self, step: pb.StepStart) -> None:
        members = frozenset(step.participants)
        if self.finished:
            raise ProtocolError(f"step {step.step!r} started after this party received the job's result")
        if self.party_id not in members:
            raise ProtocolError(f"step {step.step!r} does not include this party")
        if len(members) < self.policy.min_parties and not step.step.endswith(RECOVER_SUFFIX):
            allows = (f" (the job itself would go on with {self.job_min_parties}, its min_parties: this party's own "
                      "setting decided)") if 0 < self.job_min_parties < self.policy.min_parties else ""
            raise ProtocolError(f"step {step.step!r} attempt {step.round} has {len(members)} participants, fewer than "
                                f"this party's minimum of {self.policy.min_parties} "
                                f"({self.policy.named('min_parties')}, default {default('min_parties')}){allows}")
        previous = self.last.get(step.step)
        if previous is not None:
            attempt, before = previous
            name = step.step.split(".")[-1].removesuffix(CONFIRM_SUFFIX)  # a sum's confirm step goes with it
            resumable = name in RESUMABLE_STEPS  # may go on with the same parties
            same = members <= before if resumable else members < before
            if step.round <= attempt or not same:
                raise ProtocolError(f"step {step.step!r} restarted as attempt {step.round} with {sorted(members)} "
                                    f"after "
                                    f"attempt {attempt} with {sorted(before)}: a restart must have a later attempt and "
                                    + ("no new participant" if resumable else "strictly fewer participants"))
            if name in SAME_SET_STEPS and members == before:
                kept = self.kept_sets[step.step] = self.kept_sets.get(step.step, 0) + 1
                if kept > MAX_SAME_SET:
                    raise ProtocolError(f"step {step.step!r} restarted among the same parties {kept} times (at most "
                                        f"{MAX_SAME_SET}, as often as a coordinator may restart in one sum)")
        self.last[step.step] = (step.round, members)
