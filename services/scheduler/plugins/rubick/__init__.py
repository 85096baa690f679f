"""Rubick: execution plans and tenants' guarantees, live and in the policy."""
