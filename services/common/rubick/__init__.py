"""Rubick (EuroSys'25): execution plans, the 7-parameter performance model, sensitivity."""
