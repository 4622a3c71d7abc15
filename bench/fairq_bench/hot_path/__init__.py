"""The hot-path benchmark: fairq's cost per token and what it adds to a first token."""
