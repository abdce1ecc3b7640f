"""The process's plumbing, below every layer: exit codes, the supervisor, signals, the event
loop, malloc, the socket claim, startup steps (``accyd.serving`` runs a server with them)."""
