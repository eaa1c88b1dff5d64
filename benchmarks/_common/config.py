"""Typed per-method configuration: frozen dataclasses whose overrides (the CLI's
`--set key=value`) reject an unknown key or a value of the wrong type."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Literal, Self


def _type_name(hint) -> str:
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _conform(value, hint):
    """`value` as a `hint` (an int is a valid float), or raise `TypeError`."""
    if typing.get_origin(hint) is Literal:
        options = typing.get_args(hint)
        if value in options and type(value) in {type(a) for a in options}:
            return value
    elif isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        for option in typing.get_args(hint):
            try:
                return _conform(value, option)
            except TypeError:
                continue
    elif hint in (float, int):
        if isinstance(value, int | hint) and not isinstance(value, bool):
            return hint(value)
    elif isinstance(value, hint):
        return value
    raise TypeError(_type_name(hint))


class ConfigError(ValueError):
    """An unknown hyperparameter, or a value of the wrong type."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """A method's hyperparameters, typed fields checked against their annotations
    (`bool`, `int`, `float`, `str`, `None`, `Literal` and unions of these)."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            try:
                conformed = _conform(value, hints[field.name])
            except TypeError as error:
                raise ConfigError(
                    f"Hyperparameter {field.name!r} must be {error}, got {value!r}."
                ) from None
            # Frozen: the one place a field is normalised (an int given as a float).
            object.__setattr__(self, field.name, conformed)

    def with_overrides(self, overrides: dict | None, method: str = "") -> Self:
        """A copy with `overrides` (`{key: value}`); `ConfigError` names an unknown
        key or a value of the wrong type."""
        name = method or type(self).__name__
        known = [field.name for field in dataclasses.fields(self)]
        for key in overrides or {}:
            if key not in known:
                raise ConfigError(
                    f"Method {name!r} has no hyperparameter {key!r}; its "
                    f"hyperparameters are {sorted(known)}."
                )
        try:
            return dataclasses.replace(self, **(overrides or {}))
        except ConfigError as error:
            raise ConfigError(f"Method {name!r}: {error}") from None

    def replace(self, **overrides) -> Self:
        """`with_overrides` with keyword arguments."""
        return self.with_overrides(overrides)

    def as_dict(self) -> dict:
        """The hyperparameters as a JSON-ready dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingConfig(Config):
    """The training loop's hyperparameters (`lr_schedule`: constant, or cosine to
    1%; `validate_every` `None`: about 50 points; `max_time_s` `None`: no limit)."""

    epochs: int
    batch_size: int
    lr: float
    lr_schedule: Literal["constant", "cosine"] = "constant"
    validate_every: int | None = 1
    max_time_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaperTrainingConfig(TrainingConfig):
    """The paper's optimiser for Pinet (App. B.2), which the DC3 baselines share:
    batches of 2048, Adam at 1e-2 at a constant rate, 50 epochs."""

    epochs: int = 50
    batch_size: int = 2048
    lr: float = 1e-2


@dataclasses.dataclass(frozen=True, kw_only=True)
class SolverConfig(Config):
    """How the harness times (`timing.InferenceTiming`) and scores (the first
    `test_rows`; `None`: all) a solver that solves one instance at a time."""

    timing_batch_rows: int | None = None
    timing_budget_s: float = 20.0
    timing_repeats: int = 3
    test_rows: int | None = None
