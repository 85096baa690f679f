"""EasyScale (SC'23): the greedy inter-job allocator and the YARN-CS baseline."""
