"""Wire constants and layouts shared by the daemon and its clients."""
