"""What the scheduler keeps: the stores (SQL and in memory, with batched writes), their
tables, the in-process state a round reads, and the jobs' logs."""
