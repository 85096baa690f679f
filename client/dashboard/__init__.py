"""`gearshift dashboard`: web pages of the jobs, each job's devices and curves over time, and the
cluster, served by Starlette over the scheduler's gRPC API (the `dashboard` extra).

Importing this package imports no web library: `options` is what the CLI needs.
"""
