"""Settings read from ``JOBSD_*`` environment variables, with pydantic alone.

A field ``pool_size`` reads ``JOBSD_POOL_SIZE`` (any case). Values given to the
constructor win over the environment; the environment wins over the defaults. Every
value arrives as the variable's text and the field's own type and validators read it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["EnvSettings", "environment_values"]


class EnvSettings(BaseModel):
    """A model whose unset fields come from ``<env_prefix><FIELD>`` variables."""

    model_config = ConfigDict(extra="ignore")
    env_prefix: ClassVar[str] = "JOBSD_"

    def __init__(self, **values: Any) -> None:
        super().__init__(**{**environment_values(type(self)), **values})


def environment_values(
    model: type[EnvSettings], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return the fields of ``model`` that the environment sets, as text, by field name."""
    prefix = model.env_prefix.lower()
    by_name = {
        key.lower()[len(prefix) :]: value
        for key, value in (os.environ if environ is None else environ).items()
        if key.lower().startswith(prefix)
    }
    return {name: by_name[name] for name in model.model_fields if name in by_name}
