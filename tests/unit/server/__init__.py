"""Unit tests of the server core (tidelog_server)."""
