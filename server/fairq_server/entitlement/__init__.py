"""Entitlement over time: quotas and budgets per team and user, counted in a limit book."""
