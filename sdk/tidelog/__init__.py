"""Tidelog's Python SDK (placeholder: the curated exports are filled in below)."""
