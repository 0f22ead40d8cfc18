"""xclp.fedavg and its wire codec: sampling, training sets and batches, the update ring, job params."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from xclp.crypto.masking import PairwiseMasker, generate_x25519, public_bytes, shared_secret
from xclp.errors import ConfigError, InvalidInput
from xclp.fedavg import PseudoLabels, batches, sample_parties, server_update, training_set
from xclp.nn import SGD, Architecture, Network
from xclp.v1 import training
from xclp.v1.fedavg import FedavgJobParams
from xclp.v1.registry import parse_params


def test_sampling_is_a_public_seeded_draw_of_the_right_size() -> None:
    parties = [f"p{i}" for i in range(10)]
    draws = [sample_parties(7, t, parties, 0.3) for t in range(50)]
    assert all(len(d) == 3 and list(d) == sorted(set(d)) and set(d) <= set(parties) for d in draws)
    assert draws == [sample_parties(7, t, list(reversed(parties)), 0.3) for t in range(50)]  # order-free
    assert len(set(draws)) > 20  # rounds differ
    assert draws != [sample_parties(8, t, parties, 0.3) for t in range(50)]  # the seed matters
    counts = np.bincount([int(p[1:]) for d in draws for p in d], minlength=10)
    assert chisquare(counts).pvalue > 0.001  # every party is drawn about equally often
    assert sample_parties(0, 0, parties, 1.0) == tuple(sorted(parties))
    assert len(sample_parties(0, 0, parties, 0.01)) == 1


def _data(n_l: int, n_u: int) -> tuple[np.ndarray, np.ndarray]:
    X = np.arange((n_l + n_u) * 2, dtype=np.float64).reshape(-1, 2)
    y = np.concatenate([np.arange(n_l) % 3, np.full(n_u, -1)])
    return X, y


def test_training_set_weights_pseudo_labels_by_confidence_and_drops_zero_weights() -> None:
    X, y = _data(4, 5)
    pseudo = PseudoLabels(np.array([2, 1, 0, 1, 2]), np.array([0.5, 0.0, 1.0, 0.25, 0.0]))
    ts = training_set(X, y, pseudo)
    assert ts.rows == 4 + 3
    np.testing.assert_array_equal(ts.X_pseudo, X[[4, 6, 7]])
    np.testing.assert_array_equal(ts.y_pseudo, [2, 0, 1])
    np.testing.assert_array_equal(ts.w_pseudo, [0.5, 1.0, 0.25])
    assert training_set(X, y, None).rows == 4
    with pytest.raises(InvalidInput, match="5 unlabeled rows"):
        training_set(X, y, PseudoLabels(np.zeros(3, dtype=np.int64), np.ones(3)))


def test_each_batch_holds_equally_many_labeled_and_pseudo_labeled_rows() -> None:
    X, y = _data(6, 20)
    ts = training_set(X, y, PseudoLabels(np.zeros(20, dtype=np.int64), np.full(20, 0.5)))
    got = list(batches(ts, SGD(batch=4, epochs=2), np.random.default_rng(0)))
    assert len(got) == 2 * 5  # an epoch passes over the 20 pseudo-labeled rows, 4 at a time
    seen = set()
    for Xb, _, wb in got:
        assert Xb.shape[0] == 8 and np.count_nonzero(wb == 1.0) == 4 and np.count_nonzero(wb == 0.5) == 4
        seen |= {int(v) for v in Xb[wb == 0.5, 0]}
    assert seen == {2 * i for i in range(6, 26)}  # every pseudo-labeled row is used


def test_server_update_is_the_row_weighted_mean_of_the_party_models() -> None:
    arch = Architecture((2, 2, 2))
    theta = Network.init(arch, np.random.default_rng(0))
    models = [theta.flat + np.random.default_rng(i).normal(size=arch.n_params) for i in (1, 2)]
    rows = [3, 7]
    delta = sum(n * (m - theta.flat) for n, m in zip(rows, models))
    np.testing.assert_allclose(server_update(theta, delta, 10).flat, (3 * models[0] + 7 * models[1]) / 10)
    np.testing.assert_array_equal(server_update(theta, np.zeros(arch.n_params), 0).flat, theta.flat)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.floats(-1e3, 1e3)), min_size=2, max_size=6))
def test_masked_updates_sum_to_the_fixed_point_total(parties: list[tuple[int, float]]) -> None:
    ids = [f"p{i}" for i in range(len(parties))]
    keys = {p: generate_x25519() for p in ids}
    session = training.round_session(b"s" * 32, 3)
    rng = np.random.default_rng(0)
    deltas = [scale * rng.normal(size=5) / 5 for _, scale in parties]
    masked = []
    for pid, (rows, _), delta in zip(ids, parties, deltas):
        masker = PairwiseMasker(pid, {q: shared_secret(keys[pid], public_bytes(keys[q])) for q in ids if q != pid},
                                session)
        local = training.encode_update(delta, rows, 24, len(ids))
        masked.append(masker.apply(local, purpose=training.UPDATE_PURPOSE, attempt=0, participants=ids))
    total, rows = training.decode_update(np.sum(masked, axis=0, dtype=np.uint64), 24)
    assert rows == sum(r for r, _ in parties)
    np.testing.assert_allclose(total, np.sum(deltas, axis=0), rtol=0, atol=len(ids) * 2.0 ** -25)


def test_a_masked_update_looks_uniform_and_an_unmasked_one_does_not() -> None:
    ids = ["a", "b", "c"]
    keys = {p: generate_x25519() for p in ids}
    masker = PairwiseMasker("a", {q: shared_secret(keys["a"], public_bytes(keys[q])) for q in "bc"}, b"s" * 32)
    local = training.encode_update(np.random.default_rng(1).normal(0, 0.1, 4095), 300, 24, 3)
    masked = masker.apply(local, purpose=training.UPDATE_PURPOSE, attempt=0, participants=ids)

    def top_byte_pvalue(words: np.ndarray) -> float:
        return float(chisquare(np.bincount((words >> np.uint64(56)).astype(np.int64), minlength=256)).pvalue)

    assert top_byte_pvalue(masked) > 1e-4
    assert top_byte_pvalue(local) < 1e-12


def test_an_update_that_could_wrap_is_refused() -> None:
    with pytest.raises(InvalidInput, match="does not fit the fixed-point ring"):
        training.encode_update(np.array([2.0 ** 39]), 1, 24, 3)
    with pytest.raises(InvalidInput, match="NaN"):
        training.encode_update(np.array([np.nan]), 1, 24, 3)


def test_round_scopes_round_trip_and_reject_other_names() -> None:
    assert training.unscope(training.scoped(12, "secure_hamming")) == (12, "secure_hamming")
    for name in ("update", "r.update", "r01.update", "r1.", "r1.Update", "x1.update", "r1.update.x"):
        assert training.unscope(name) is None
    assert training.round_session(b"s", 1) != training.round_session(b"s", 2)


@pytest.mark.parametrize("params, message", [
    ({"pseudo_label": "magic"}, "pseudo_label must be one of"),
    ({"pseudo_label_space": "pixels"}, "pseudo_label_space must be one of .embedding., .input."),
    ({"hidden": []}, "hidden must be"),
    ({"hidden": "64"}, "list of layer widths"),
    ({"fraction": 0}, "fraction must be in"),
    ({"learning_rate": -1}, "learning rate"),
    ({"momentum": 1.0}, "momentum"),
    ({"frac_bits": 60}, "frac_bits"),
    ({"pseudo_label": "xclp", "key_bits": 512}, "insecure_test_keys"),
    ({"learning_rat": 0.1}, "unknown fedavg job parameter"),
])
def test_bad_fedavg_parameters_are_refused_with_the_reason(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_params("fedavg", {"n_classes": 3, **params})


def test_fedavg_params_build_the_network_and_the_rounds_xclp_job() -> None:
    p = FedavgJobParams.parse({"classes": ["x", "y"], "hidden": [5, 4], "warmup_rounds": 2, "pseudo_label": "xclp",
                               "k": 3, "lsh_bits": 128})
    assert p.architecture(7).sizes == (7, 5, 4, 2)
    assert [p.pseudo_labels_in(t) for t in range(4)] == ["none", "none", "xclp", "xclp"]
    assert (p.xclp_params().k, p.xclp_params().lsh_bits, p.xclp_params().n_classes) == (3, 128, 2)
