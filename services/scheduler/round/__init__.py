"""The round: snapshot -> allocate -> collocate -> place -> reconcile, and the daemon's
loop that drives it (rounds), the decision process (decider), task control and the
estimates it reads. The round names no plugin (tools/check_imports.py): plugins reach it
through the registry (gearshift.scheduler.plugins.registry) and the hooks the service
wires in."""
