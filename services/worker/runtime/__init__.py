"""The deterministic elastic runtime: N ESTs on any number of processes, bitwise identical.

Modules: `job` (the job API), `trainer` (one process's loop), `process` (a
training process's set-up), `tree` and `reduce` (the canonical gradient sum),
`context`, `rng`, `data`, `loader` (per-EST state and data), `checkpoint`,
`digest`, `determinism`, `settings`. This package imports nothing heavy itself
so that a launcher can prepare the environment before torch loads; its modules
import torch.
"""
