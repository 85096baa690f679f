"""The scheduler's gRPC face: the jobs and workers APIs (servicer, jobs_api), the worker
registry that heartbeats feed, the cluster view, and the heartbeat relays."""
