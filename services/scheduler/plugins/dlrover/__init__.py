"""DLRover: resource plans from history, parameter-server jobs, stragglers, history caps."""
