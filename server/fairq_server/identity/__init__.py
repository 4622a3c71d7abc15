"""Identities from the organisation's identity provider: bearer JWTs checked against a JWKS."""
