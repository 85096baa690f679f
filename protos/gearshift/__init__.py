"""Gearshift: elastic, bitwise-deterministic training on shared heterogeneous GPU clusters."""

__version__ = "0.1.0"
