"""Test doubles for code built on the daemon: a backend that records calls and injects failures."""

from accyd.testing.recording import RecordingBackend

__all__ = ["RecordingBackend"]
