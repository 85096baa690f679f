"""Elastic parameter-server training: a Wide&Deep model on synthetic click data.

A second runtime mode beside the deterministic EST runtime, for sparse models
(DLRover). Embedding rows live on PS processes (row id mod PS count); workers
pull the rows of their batch, compute the dense part and push sparse gradients
over `torch.distributed.rpc`. Workers never wait for each other, so a PS job is
asynchronous and NOT bitwise reproducible.

Modules: `data` (the seeded click generator), `sharding` (which PS owns a row,
re-partitioning), `model` (the dense network and the forward pass), `server`
(a PS process), `trainer` (a worker process), `checkpoint` (shards on disk,
manifest, held-out AUC), `launch` (one phase = one set of processes), `run` (CLI).
"""
