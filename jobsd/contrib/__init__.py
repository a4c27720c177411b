"""Integrations with other libraries."""
