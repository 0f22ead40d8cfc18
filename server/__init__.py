"""The coordinator (`xclp.server`): gRPC service, job state machines, its protocol steps, `xclp-server` CLI.

- `jobs/`: one explicit state machine per job type (`base.Job`: admission, roster, common seed,
  steps, deadlines, dropouts, relays; `allreduce`, `xclp`). They move, validate and route bytes
  and call the steps; they hold no math.
- `steps/`: the coordinator's side of each protocol as pure functions (inputs -> outputs, no
  I/O), the same in the service and in `xclp.simulation`.
- `service`, `coordinator`, `config`, `cli`: gRPC, the job table, settings files, the CLI.
"""
