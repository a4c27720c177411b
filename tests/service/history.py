"""Moved to tests/support/history.py; kept so that tests written before the move still
import (``from support.history import ...`` is the way now)."""

from support.history import assert_history_complete as assert_history_complete
from support.history import assert_history_complete_async as assert_history_complete_async
from support.history import history_problems as history_problems
