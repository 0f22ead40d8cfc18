"""What an XCLP job will ask of a party, estimated before any of the work (client/jobs/estimate.py)."""

from __future__ import annotations

import pytest

from xclp.client.jobs.estimate import OperationCosts, check_memory, intra_bytes, paillier_seconds
from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.secure_hamming import SlotLayout
from xclp.errors import ResourceExhausted


def test_the_memory_estimate_refuses_390000_rows_without_allocating_and_says_what_to_do():
    with pytest.raises(ResourceExhausted) as exc:
        check_memory(390_000, 64 * 2**30)
    message = str(exc.value)
    assert "566.6 GiB" in message and "390000 × 390000" in message
    assert "subsample to at most about 131072 rows" in message
    check_memory(10_000, 64 * 2**30)  # 0.4 GiB: fine
    check_memory(390_000, 0)  # 0: no limit
    assert intra_bytes(1000) == 4_000_000


def test_the_paillier_estimate_grows_with_the_product_of_the_rows():
    keypair = PaillierKeypair.generate(512, allow_insecure_test_size=True)
    costs = OperationCosts.measure(keypair)
    assert costs.decrypt > 0 and costs.encrypt > 0 and costs.multiply > 0
    layout = SlotLayout(2048, 1024)  # K = 186 slots of 11 bits
    decrypt_only = OperationCosts(encrypt=0.0, multiply=0.0, decrypt=1.0)
    assert paillier_seconds(decrypt_only, layout, 1860, {"b": 500, "c": 1000}, 1) == 10 * 1500  # ⌈n/K⌉ · Σ n_k
    assert paillier_seconds(decrypt_only, layout, 1860, {"b": 500, "c": 1000}, 4) == 10 * 1500 / 4
    encrypt_only = OperationCosts(encrypt=1.0, multiply=0.0, decrypt=0.0)
    assert paillier_seconds(encrypt_only, layout, 1860, {"b": 500}, 1) == 1024 * 10  # L · ⌈n/K⌉ slices
    multiply_only = OperationCosts(encrypt=0.0, multiply=1.0, decrypt=0.0)
    assert paillier_seconds(multiply_only, layout, 1860, {"b": 372}, 1) == 512 * 2 * 1860  # L/2 · ⌈n_k/K⌉ · n
