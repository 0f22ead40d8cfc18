"""The party's protocol steps as pure functions (inputs -> outputs, no I/O).

The party's job state machines (`xclp.client.jobs`) run these and ship what they return;
`xclp.simulation` runs every party's and the coordinator's steps in one process, passing the exact
bytes that would travel.
"""
