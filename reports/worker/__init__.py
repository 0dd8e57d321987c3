"""Dramatiq's side: the broker, and every middleware and Redis key of Dramatiq's the system relies on."""
