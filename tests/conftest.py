"""Shared pytest configuration: make the source tree importable without installing it."""
