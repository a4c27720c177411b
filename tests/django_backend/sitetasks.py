"""Tasks of the tests' own, beside the newsletter site's: one per behaviour checked."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task
except ImportError:  # Django before 6.0: the backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def shout(word: str) -> str:
    return word.upper()


@task
def fails(message: str) -> None:
    raise ValueError(message)


@task
def returns_a_set() -> Any:
    return {1, 2}


@task(takes_context=True)
def which_attempt(context: Any) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id}


@task
def record(name: str) -> str:
    return name


@task(takes_context=True)
async def which_attempt_async(context: Any) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(backend="other")
def elsewhere(n: int) -> int:
    return n * 2
