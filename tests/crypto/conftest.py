"""Fixtures shared by the crypto tests."""

from __future__ import annotations

import pytest

from xclp.crypto.paillier import PaillierKeypair


@pytest.fixture(scope="session")
def keypair() -> PaillierKeypair:
    """One 1024-bit test key (insecure size, tests only) for the Paillier and SecureHamming tests."""
    return PaillierKeypair.generate(1024, allow_insecure_test_size=True)
