"""The trace simulator: the round's pipeline driven by simulated time (simulator,
simulate), Gavel's and Rubick's traces, and the plots."""
