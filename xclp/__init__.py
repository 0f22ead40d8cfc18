"""xclp: secure multi-party label propagation, FlyNN and RACE for institutions (docs/design.md §1).

One import namespace. Its top-level modules are the methods as plain, network-free library code:
LSH, Hamming matrices, the neighbour graph and influence matrix, label propagation, FlyNN, RACE,
DP noise (`privacy`), party tables (`tables`); pure functions on numpy arrays, deterministic
given seeds, against which the secure protocols are checked. Beside them:

- `xclp.crypto`: the cryptographic primitives;
- `xclp.v1`: the contract coordinator and party share (protobuf, wire codec, job schemas, names);
- `xclp.server`, `xclp.client`: the coordinator and the party, which never import each other;
- `xclp.simulation`: a whole protocol in one process (tests, benchmarks);
- `xclp.demo`: `xclp-client demo`, every role as a real process on localhost.

`tests/test_architecture.py` keeps these arrows true.
"""

__version__ = "0.1.0"
