"""The job's fields on log records: ``jobsd.logs.JobContextFilter`` and ``job_fields``."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from jobsd import logs
from jobsd.logs import JOB_FIELDS, JobContextFilter, TextFormatter, job_fields

CONFIG_DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@pytest.fixture
def root_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Logger]:
    """Give the test the root logger; put its handlers and level back afterwards (and
    what ``installed`` says: handler processes of later tests must not follow it)."""
    monkeypatch.setattr(logs, "_installed", None)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _record(**extra: Any) -> logging.LogRecord:
    return logging.makeLogRecord({"msg": "sending mail", "levelname": "INFO", **extra})


def _filtered(**extra: Any) -> dict[str, Any]:
    record = _record(**extra)
    assert JobContextFilter().filter(record) is True
    return {k: v for k, v in vars(record).items() if k in (*JOB_FIELDS, *extra)}


def test_records_carry_the_job_only_inside_its_run() -> None:
    assert _filtered() == {}
    with job_fields("j1", "send_mail", 2, "mail", "acme"):
        assert _filtered() == {
            "job_id": "j1",
            "type": "send_mail",
            "attempt": 2,
            "queue": "mail",
            "org_id": "acme",
        }
        assert logs.current_job_fields() is not None
    assert _filtered() == {}
    assert logs.current_job_fields() is None


def test_a_field_the_call_gives_is_kept() -> None:
    with job_fields("j1", "send_mail", 1, "mail", "acme"):
        fields = _filtered(job_id="other", type="explicit")
    assert fields["job_id"] == "other" and fields["type"] == "explicit"
    assert fields["org_id"] == "acme"


def test_a_run_that_raises_leaves_no_fields_behind() -> None:
    with pytest.raises(RuntimeError), job_fields("j1", "t", 1, "q", "o"):
        raise RuntimeError("handler failed")
    assert _filtered() == {}


def test_text_lines_end_with_the_job_fields() -> None:
    with job_fields("j1", "send_mail", 1, "mail", "acme"):
        record = _record(to="ada@example.com")
        JobContextFilter().filter(record)
    assert TextFormatter().format(record) == (
        "INFO sending mail to=ada@example.com job_id=j1 type=send_mail attempt=1 "
        "queue=mail org_id=acme"
    )


def test_a_new_thread_starts_without_the_job() -> None:
    seen: list[object] = []
    with job_fields("j1", "t", 1, "q", "o"):
        thread = threading.Thread(target=lambda: seen.append(logs.current_job_fields()))
        thread.start()
        thread.join()
    assert seen == [None]  # why a sync handler's thread runs in a copy of the run's context


@pytest.mark.anyio
async def test_concurrent_runs_each_see_their_own_job() -> None:
    seen: dict[str, list[str]] = {"a": [], "b": []}
    both_set = anyio.Event()
    started = 0

    async def run(name: str) -> None:
        nonlocal started
        with job_fields(name, "t", 1, "q", "o"):
            started += 1
            if started == 2:
                both_set.set()
            await both_set.wait()  # each run's value is set while the other's is
            for _ in range(3):
                fields = logs.current_job_fields()
                assert fields is not None
                seen[name].append(fields["job_id"])
                await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a")
        tg.start_soon(run, "b")
    assert seen == {"a": ["a"] * 3, "b": ["b"] * 3}
    assert logs.current_job_fields() is None


def test_setup_logging_tags_records_and_says_what_it_set(
    root_logging: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.setup_logging("info", "json")
    assert logs.installed() == ("INFO", "json")
    log = logging.getLogger("myapp")
    log.info("outside")
    with job_fields("j1", "send_mail", 1, "mail", "acme"):
        log.info("inside", extra={"to": "ada"})
    outside, inside = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert not set(JOB_FIELDS) & set(outside)
    assert inside["event"] == "inside" and inside["logger"] == "myapp"
    assert {k: inside[k] for k in JOB_FIELDS} == {
        "job_id": "j1",
        "type": "send_mail",
        "attempt": 1,
        "queue": "mail",
        "org_id": "acme",
    }


def test_the_documented_dict_config_tags_an_applications_lines(
    root_logging: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    text = CONFIG_DOC.read_text(encoding="utf-8")
    section = text[text.index("\n## Job context in logs\n") :]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(CONFIG_DOC), "exec"), {})
    log = logging.getLogger("myapp.mail")
    with job_fields("j9", "send_mail", 3, "mail", "globex"):
        log.info("sending mail")
    log.info("idle")
    inside, outside = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert inside["job_id"] == "j9" and inside["attempt"] == 3 and inside["org_id"] == "globex"
    assert "job_id" not in outside


def test_a_format_string_with_defaults_as_documented() -> None:
    formatter = logging.Formatter(
        "%(levelname)s %(message)s job_id=%(job_id)s", defaults={"job_id": "-"}
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(JobContextFilter())
    log = logging.getLogger("test_log_context.format")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        log.info("idle")
        with job_fields("j1", "t", 1, "q", "o"):
            log.info("busy")
    finally:
        log.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["INFO idle job_id=-", "INFO busy job_id=j1"]
