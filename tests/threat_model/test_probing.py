"""A stranger probing the coordinator: who is allow-listed, which jobs exist.

Anyone who reaches the port can call Challenge and Join. Before a caller has proven it holds an
allow-listed party's identity key, every refusal is the same: an unknown party id, a known id with
another key, a job that exists or not. (It used to hear PERMISSION_DENIED for an unknown id and
UNAUTHENTICATED for a known one, and "no job" before its key was even looked at.)
"""

from __future__ import annotations

import grpc
import pytest

from tests.harness import allow_list, challenge, coordinator, job
from tests.service.test_service import FLYNN, join_request
from xclp.v1 import xclp_pb2_grpc as pb_grpc


def refusal(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details().replace("'mallory'", "'X'").replace("'a'", "'X'")


def test_a_stranger_hears_one_answer_whoever_it_claims_to_be_and_whatever_job_it_names(keys) -> None:
    with coordinator(allow_list(keys), [job("f", "flynn", FLYNN)]) as (_, address), \
            grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        joins = {(claimed, job_id): refusal(lambda c=claimed, j=job_id: stub.Join(
                     join_request(stub, keys["mallory"], c, job_id=j, nonce=bytes(16)), timeout=10))
                 for claimed in ("mallory", "a") for job_id in ("f", "nope")}
        assert len(set(joins.values())) == 1, joins
        code, details = next(iter(joins.values()))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "an unknown party, or another key" in details
        challenges = {claimed: refusal(lambda c=claimed: challenge(stub, keys["mallory"], c, "f"))
                      for claimed in ("mallory", "a")}
        assert len(set(challenges.values())) == 1, challenges
        assert next(iter(challenges.values()))[0] == grpc.StatusCode.UNAUTHENTICATED
