"""Cryptographic primitives (`xclp.crypto`): Paillier and packed SecureHamming, pairwise masks, KDF,
AEAD, fixed-point ring, identities and certificates (docs/design.md §2, §4, §5.3, §5.6). No gRPC here;
DP noise, which the methods use, is `xclp.privacy.noise`."""
