"""Example jobs that need no download (the runtime issue adds them)."""
