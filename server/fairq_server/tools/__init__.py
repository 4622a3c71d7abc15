"""Operator tools behind ``fairq keys``, ``fairq top`` and ``fairq health``."""
