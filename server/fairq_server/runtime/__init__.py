"""What keeps the process's event loop healthy: supervision, time-slicing, pacing, GC pacing.

Below every other part: nothing here knows of scheduling, doors or backends.
"""
