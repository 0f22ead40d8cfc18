"""The party's side of the phases every job composes (docs/architecture.md): the common seed,
the data preparation, and the one masked sum."""
