"""Alembic migrations: the one schema history of every Gearshift table (Brain and scheduler)."""
