"""The daemon process: supervisor, signals, exit codes, the event loop, malloc, the socket."""
