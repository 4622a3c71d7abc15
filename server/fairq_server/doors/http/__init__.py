"""The OpenAI-compatible HTTP door (chat, completions, models): :mod:`.server` assembles it."""
