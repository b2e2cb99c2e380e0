"""Config sections: pydantic models, each setting defined once with its default and its bounds.

    class SearchConfig(Section):
        trials_per_iter: int = Field(16, ge=1)
        cost_model: OneOf(cost_model_names) = "xgb"

The engine's own settings (``SearchConfig``, ``MeasureConfig``) and the run config's sections
(:mod:`dynatune.run.config`) are such models, so the YAML schema and the engine can never drift apart.
Values are checked strictly (``'8'`` is not an integer, ``1`` is not ``true``), on construction and on
assignment; :mod:`dynatune.run.config` turns pydantic's errors into ``key.path: message`` lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

MAX_SEED = 2**32 - 1  # seeds are numpy/xgboost seeds: 32 bits

CONFIG_ERROR = "dynatune_config"  # the error type of :func:`problem`


class Section(BaseModel):
    """A config section: unknown keys are errors, values are checked strictly, on assignment too."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)


def problem(message: str, *at: tuple[str, str]) -> PydanticCustomError:
    """A check's failure, for a validator to raise: ``message`` at the value's own key path, or the
    ``(sub_path, message)`` pairs in ``at`` (several problems at once), each sub path (``.input``, ``[1]``)
    under the value's path."""
    ctx = {"message": message, "at": list(at) or [("", message)]}
    return PydanticCustomError(CONFIG_ERROR, "{message}", ctx)


def _not_blank(v: str) -> str:
    if not v.strip():
        raise problem("must not be empty")
    return v


Text = Annotated[str, AfterValidator(_not_blank)]  # a string with something in it


def OneOf(names: Callable[[], Iterable[str]]):
    """A string naming one of a registry's entries; ``names`` is called when checking (the registry is read
    late) and when writing the JSON schema (an editor completes the names)."""

    def check(v: str) -> str:
        choices = tuple(names())
        if v not in choices:
            raise problem(f"must be one of {', '.join(choices)}, got {_repr(v)}")
        return v

    return Annotated[
        str,
        AfterValidator(check),
        AfterValidator(_not_blank),
        Field(json_schema_extra=lambda schema: schema.update(enum=list(names()))),
    ]


def _repr(v: str, limit: int = 60) -> str:
    s = " ".join(repr(v).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."
