"""Tenancy: teams and their weights, quotas and budgets, prices, and their managed copies.

Who may use how much over time (``docs/design/tenancy.md``): :mod:`.teams` and
:mod:`.team_labels`, the rules resolved per request (:mod:`.rules`), the dispatcher's checker
(:mod:`.checker`) over a limit book (:mod:`.books`), the live copies set over the Admin API
(:mod:`.managed`) and where each user stands (:mod:`.standing`).
"""
