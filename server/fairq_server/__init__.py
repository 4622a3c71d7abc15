"""fairq server."""
