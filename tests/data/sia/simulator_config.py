"""A miniature of the Sia artifact's simulator_config.py (written for the tests): two GPU types."""

cluster_ngpus_per_node = {"fast": 2, "slow": 4}
cluster_nnodes = {"fast": 2, "slow": 1}
SLOWDOWNS = {"toy": 2.0}
