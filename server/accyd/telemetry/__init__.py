"""What the daemon tells about itself in numbers: its metrics, read from the core's status."""
