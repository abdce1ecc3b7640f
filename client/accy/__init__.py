"""accy: the Python client of the accy GPU launch daemon."""
