"""The party (`xclp.client`): dials the coordinator, runs its side of each job, `xclp-client` CLI.

- `jobs/`: the party's state machine per job type after setup (`allreduce.AllReduceParty`,
  `xclp.XclpParty`); `session.PartySession` runs setup (roster, pairwise keys, common seed) and
  hands each later step and message to one of them. They move and check bytes, no math.
- `steps/`: the party's side of each protocol as pure functions (inputs -> outputs, no I/O), the
  same in the service and in `xclp.simulation`.
- `connection`, `models`, `cli`: the gRPC channel, model files, the CLI.
"""
