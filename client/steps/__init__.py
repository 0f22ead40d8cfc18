"""The party's protocol steps as pure functions (inputs -> outputs, no I/O).

The party process (`client/*.py`) runs these and ships what they return; `inprocess.py` runs every
party's and the coordinator's steps in one process, passing the exact bytes that would travel.
"""
