"""The coordinator's phases every job composes (docs/architecture.md): what a phase is
(`base`), the common seed, the data preparation, and the one masked sum."""
