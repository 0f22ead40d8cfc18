"""Job state machines on the coordinator: `base` (admission, roster, common seed, steps,
deadlines, dropouts, relay) and one module per job type (`allreduce` for FlyNN and RACE)."""
