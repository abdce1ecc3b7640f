"""What the daemon tells about itself: structured logs (bounded per client) and metrics."""
