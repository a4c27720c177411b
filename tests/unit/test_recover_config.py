"""A recover hook is for at_most_once types only: any other is refused at registration.

Recovery itself runs against a database in tests/service/test_recover.py."""

from __future__ import annotations

import pytest

import jobsd
from jobsd.recovery import AMBIGUOUS
from jobsd.registry import Registry


def test_recover_needs_at_most_once() -> None:
    with pytest.raises(jobsd.ConfigError, match="at_most_once"):
        jobsd.handler("x", recover=lambda job: AMBIGUOUS, registry=Registry())
