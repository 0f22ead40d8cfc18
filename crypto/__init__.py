"""Cryptographic primitives: packed Paillier SecureHamming, pairwise masks, fixed-point ring, DP noise, identities (DESIGN §2, §4, §5.3, §5.6, §6). No gRPC here."""
