"""The configuration as one product: the versioned SchedulerConfiguration file
(configuration), the settings a round runs with (settings), and `python -m
gearshift.scheduler.config.cli`."""
