"""Issue 11's settings and handler options: bad values are refused clearly, up front."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import jobsd
from jobsd.registry import Registry
from jobsd.settings import Settings
from jobsd.worker.children import describe_exit
from jobsd.worker.invoke import stall_check_s


def test_a_fault_point_needs_allow_faults() -> None:
    with pytest.raises(ValidationError, match="JOBSD_ALLOW_FAULTS=1"):
        Settings(fault="after_publish")
    assert Settings(fault="after_outcome_sent", allow_faults=True).fault == "after_outcome_sent"
    with pytest.raises(ValidationError):
        Settings(fault="somewhere_else", allow_faults=True)


def test_isolation_stall_and_caps_settings() -> None:
    default = Settings()
    assert (default.isolation, default.stall_after) == ("auto", None)
    assert (default.max_jobs_per_child, default.max_child_memory) == (None, None)
    assert Settings(max_child_memory="512MiB").max_child_memory == 512 * 1024 * 1024
    assert Settings(max_child_memory="1GB", max_jobs_per_child=5).max_child_memory == 10**9
    for bad_child in ({"max_child_memory": "lots"}, {"max_jobs_per_child": 0}):
        with pytest.raises(ValidationError):
            Settings(**bad_child)
    assert default.max_report_bytes == default.max_progress_bytes == 1_048_576
    assert Settings(stall_after="1.5m").stall_after == 90.0
    assert Settings(stall_after="").stall_after is None
    for bad in ({"isolation": "thread"}, {"stall_after": 0}, {"max_report_bytes": 0}):
        with pytest.raises(ValidationError):
            Settings(**bad)


def test_the_worker_lease_and_its_renewal() -> None:
    default = Settings()
    assert (default.worker_lease, default.lease_renew_s) == (30.0, 5.0)
    # renewed at least six times per lease, whatever the death check interval
    assert Settings(worker_lease="3s", death_check_interval=1).lease_renew_s == 0.5
    with pytest.raises(ValidationError, match="worker_lease must be at least 1 s"):
        Settings(worker_lease="500ms")


def test_handler_options_are_checked_at_registration() -> None:
    with pytest.raises(jobsd.ConfigError, match="isolation of 'x' must be"):
        jobsd.handler("x", isolation="thread", registry=Registry())  # type: ignore[arg-type]
    with pytest.raises(jobsd.ConfigError, match="stall_after of 'x' must be positive"):
        jobsd.handler("x", stall_after=0, registry=Registry())
    with pytest.raises(jobsd.ConfigError, match="max_jobs_per_child of 'x' must be at least 1"):
        jobsd.handler("x", max_jobs_per_child=0, registry=Registry())
    with pytest.raises(jobsd.ConfigError, match="max_child_memory of 'x': not a size"):
        jobsd.handler("x", max_child_memory="plenty", registry=Registry())


def _sync_module_level(ctx: jobsd.JobContext) -> None:
    """A sync handler a child process can import."""


async def _async_module_level(ctx: jobsd.JobContext) -> None:
    """An async handler."""


def test_auto_puts_importable_sync_handlers_in_processes() -> None:
    registry = Registry()

    def local(ctx: jobsd.JobContext) -> None:
        """Defined in a function: no child can import it."""

    jobsd.handler("sync", registry=registry)(_sync_module_level)
    jobsd.handler("async", registry=registry)(_async_module_level)
    jobsd.handler("local", registry=registry)(local)
    jobsd.handler("forced", isolation="process", registry=registry)(_async_module_level)
    jobsd.handler("thread", isolation="none", registry=registry)(_sync_module_level)
    where = {
        name: [registry.get(name).runs_in_process(d) for d in ("auto", "none", "process")]  # type: ignore[union-attr]
        for name in ("sync", "async", "local", "forced", "thread")
    }
    assert where == {
        "sync": [True, False, True],
        "async": [False, False, True],
        "local": [False, False, True],
        "forced": [True, True, True],
        "thread": [False, False, False],
    }


def test_how_a_child_ended_and_how_often_stalls_are_checked() -> None:
    assert describe_exit(-11) == "killed by signal SIGSEGV (11)"
    assert describe_exit(-9) == "killed by signal SIGKILL (9)"
    assert describe_exit(3) == "exited with code 3"
    assert (stall_check_s(0.4), stall_check_s(60)) == (0.1, 1.0)
