"""The benchmark's floor for SecureHamming: CRT decryption alone of concatenated ciphertexts.

Not installed code: `benchmarks/secure_hamming.py` compares the whole protocol with it, and a test
checks it against single decryptions. It runs A's own decryption task (`role_a`) on the pool.
"""

from __future__ import annotations

from concurrent.futures import Executor

import numpy as np
from gmpy2 import mpz

from xclp.crypto.paillier import PaillierKeypair
from xclp.crypto.pool import run_tasks
from xclp.crypto.secure_hamming.role_a import _decrypt_chunk, _secret_state


def decrypt_all(keypair: PaillierKeypair, data: bytes, tasks: int, executor: Executor | None = None) -> list[mpz]:
    """CRT decryption alone of concatenated ciphertexts in `tasks` chunks (the benchmark's floor)."""
    width = keypair.public.ciphertext_bytes
    count = len(data) // width
    bounds = np.linspace(0, count, tasks + 1).astype(int)
    chunks = [(_secret_state(keypair), data[a * width : b * width]) for a, b in zip(bounds[:-1], bounds[1:])]
    return [m for part in run_tasks(_decrypt_chunk, chunks, executor) for m in part]


