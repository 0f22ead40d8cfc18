"""The party: dials the coordinator, runs a party's protocol steps, `xclp-client` CLI."""
