"""JobSpec.build without the database: its shortcut for a job with no options, and
the byte limit of org_id (which it checks without encoding short ones)."""

from __future__ import annotations

import dataclasses

import pytest

from jobsd.jobspec import JobSpec


@pytest.mark.parametrize("payload", [None, {}, {"i": 1, "s": "é"}])
def test_no_options_is_every_option_at_its_default(payload: dict[str, object] | None) -> None:
    # no options takes a shortcut; any option given (here all, at their defaults)
    # takes the checks: the same spec but for its fresh id
    short = JobSpec.build("noop", payload, org_id="org", max_payload_bytes=100)
    checked = JobSpec.build(
        "noop",
        payload,
        org_id="org",
        max_payload_bytes=100,
        queue="default",
        dedup_key=None,
        run_after=None,
        job_id=None,
        priority=0,
        concurrency_key=None,
        depends_on=(),
    )

    assert short.id != checked.id and short.id < checked.id
    assert short == dataclasses.replace(checked, id=short.id)
    for field in dataclasses.fields(JobSpec):
        got, want = getattr(short, field.name), getattr(checked, field.name)
        assert type(got) is type(want), field.name


@pytest.mark.parametrize(
    ("org_id", "accepted"),
    [
        ("a" * 255, True),
        ("a" * 256, False),
        ("\U0001f600" * 63, True),  # 252 bytes
        ("\U0001f600" * 64, False),  # 256 bytes in 64 characters
        ("é" * 127 + "a", True),  # 255 bytes
        ("é" * 128, False),  # 256 bytes
        ("\u0800" * 85, True),  # three bytes each: 255
        ("\u0800" * 86, False),
        ("", False),
    ],
)
def test_org_id_is_at_most_255_bytes(org_id: str, accepted: bool) -> None:
    for options in ({}, {"priority": 1}):
        if accepted:
            assert JobSpec.build("noop", None, org_id=org_id, **options).org_id == org_id
        else:
            with pytest.raises(ValueError, match="org_id must be a non-empty string"):
                JobSpec.build("noop", None, org_id=org_id, **options)


_UNSTORABLE = {"NUL": "a\x00b", "lone surrogate": "a\ud800b"}


@pytest.mark.parametrize("text", _UNSTORABLE.values(), ids=_UNSTORABLE.keys())
@pytest.mark.parametrize("field", ["type", "org_id", "queue", "dedup_key", "concurrency_key"])
def test_text_postgres_cannot_store_is_refused_naming_its_field(field: str, text: str) -> None:
    # before: a bare UnicodeEncodeError from the driver, or the database's DatabaseError
    args: dict[str, object] = {"type": "t", "org_id": "o"}
    if field in args:
        args[field] = text
        options: dict[str, object] = {}
    else:
        options = {field: text}
    with pytest.raises(ValueError, match=f"^{field} must not contain NUL or a lone surrogate"):
        JobSpec.build(
            str(args["type"]),
            {},
            org_id=str(args["org_id"]),
            **options,  # type: ignore[arg-type]
        )


def test_text_with_surrogate_pairs_and_accents_is_stored_as_given() -> None:
    text = "é😀\u2028"
    spec = JobSpec.build(text, {}, org_id=text, queue="q", dedup_key=text, concurrency_key=text)
    assert (spec.type, spec.org_id, spec.dedup_key, spec.concurrency_key) == (text,) * 4
