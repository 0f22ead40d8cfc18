"""A real `xclp-client` that cuts SecureHamming pairs into pieces of two 512-bit ciphertexts (many
per pair, as the test's coordinator and other parties do). Everything else is the unmodified party.

    python small_pieces_client.py <xclp-client arguments...>
"""

from __future__ import annotations

import sys

from xclp.client import cli
from xclp.v1 import secure_hamming_wire

secure_hamming_wire.PIECE_BYTES = 2 * 128

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
