"""The worker daemon and the deterministic elastic runtime (ESTs).

Importing this package must stay light: the runtime's torch imports live in
gearshift.worker.runtime.
"""
