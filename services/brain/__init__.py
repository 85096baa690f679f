"""The Brain: job histories, throughput estimates, resource plans and EST plans."""
