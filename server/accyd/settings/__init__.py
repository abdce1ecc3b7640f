"""The daemon's settings: every flag with its environment variable, and the config they make."""
