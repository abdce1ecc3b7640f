"""The ring doors' launch engine: native threads that launch checked tickets, or a Python loop."""
