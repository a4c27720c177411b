"""Moved to tests/support: import ``running_daemon`` from ``support.daemon`` and
``wait_until`` from ``support.waiting``. Kept so that tests written before the move
still import."""

from support.daemon import running_daemon as running_daemon
from support.waiting import wait_until as wait_until
