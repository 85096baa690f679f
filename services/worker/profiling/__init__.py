"""Measuring a job's model for DeepPool's planner: the torch.fx layer profiler
(fxprofile), its entry point (`python -m gearshift.worker.profiling.profile_job`, run by
`gearshift profile`) and the planner benchmark's reference models."""
