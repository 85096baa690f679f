"""The scheduler: jobs, workers, Gavel's policies and round-based mechanism, the simulator."""
