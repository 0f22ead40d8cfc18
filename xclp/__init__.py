"""xclp: the methods as plain, network-free library code (DESIGN §1).

LSH, Hamming matrices, the neighbour graph and influence matrix, label propagation, FlyNN and
RACE. Pure functions on numpy arrays, deterministic given seeds; the secure protocols in
`crypto/`, `server/` and `client/` are checked against these.
"""

__version__ = "0.1.0"
