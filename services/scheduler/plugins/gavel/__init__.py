"""Gavel (OSDI'20): the policies as optimization problems, the round mechanism, elastic rounds,
prices."""
