"""Shared pytest configuration: the source tree importable without installing it, logs captured."""

import logging

from accyd.logs import configure_logging

# The daemon's log lines go to the standard logging of their names (accyd.doors.grpc...), where
# pytest captures them per test and shows them with a failure, not in the progress output.
configure_logging("console", "info", stdlib=True)
logging.getLogger("accyd").addHandler(logging.NullHandler())
