"""Save and load models: a JSON header, then the arrays (the Equinox recipe)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import PyTree

_FORMAT = "pinet_eqx"
_FORMAT_VERSION = 1
_SCALARS = (bool, int, float, complex)


def save(path: str | os.PathLike, model: PyTree, hyperparameters: dict) -> None:
    """Write `model` to `path`: one line of JSON, then its arrays.

    The header holds `hyperparameters` (everything your code needs to rebuild the
    model's skeleton, for example layer sizes and how to regenerate the
    constraint data) and the precision it was saved in; the arrays follow, written
    by `eqx.tree_serialise_leaves`. The file holds no code, so it is safe to load
    and survives refactors of the code that built it.

    **Arguments:**

    - `path`: the file to write.
    - `model`: any PyTree, for example a `HardConstrainedNet`.
    - `hyperparameters`: a JSON-serialisable dict, passed back to `make` by
        `load`.
    """
    try:
        header = json.dumps(
            {
                "format": _FORMAT,
                "format_version": _FORMAT_VERSION,
                "jax_enable_x64": bool(jax.config.read("jax_enable_x64")),
                "hyperparameters": hyperparameters,
            }
        )
    except TypeError as e:
        raise TypeError(
            "pinet_eqx.save(path, model, hyperparameters): `hyperparameters` must be "
            f"JSON-serialisable (dicts, lists, strings, numbers): {e}"
        ) from e
    with open(path, "wb") as f:
        f.write((header + "\n").encode())
        eqx.tree_serialise_leaves(f, model)


def load(path: str | os.PathLike, make: Callable[..., PyTree]) -> PyTree:
    """Read a model written by `save`.

    `make(**hyperparameters)` rebuilds the model's skeleton from the stored
    hyperparameters; its array values are then overwritten by the stored ones, so
    it may give any values, or only shapes (`eqx.filter_eval_shape`).

    **Arguments:**

    - `path`: the file written by `save`.
    - `make`: a function of the stored hyperparameters (as keywords) returning a
        model with the structure of the saved one.

    **Returns:** the model.

    **Raises:** `ValueError` if the file is not in this format, if it was saved
    with the other setting of `jax_enable_x64` (enable or disable it before
    loading, as the message says), or if the skeleton's arrays do not match the
    stored ones in number, shape or dtype.
    """
    with open(path, "rb") as f:
        header = _read_header(f, path)
        saved_x64 = header["jax_enable_x64"]
        if saved_x64 != bool(jax.config.read("jax_enable_x64")):
            fix = "True" if saved_x64 else "False"
            raise ValueError(
                f"pinet_eqx.load({str(path)!r}): the file was saved with "
                f"jax_enable_x64={saved_x64}, so its arrays are in "
                f"{'double' if saved_x64 else 'single'} precision. Call "
                f"`jax.config.update('jax_enable_x64', {fix})` before building and "
                "loading the model, or save it again in this precision."
            )
        skeleton = make(**header["hyperparameters"])
        reader = _Reader(path)
        try:
            model = eqx.tree_deserialise_leaves(f, skeleton, filter_spec=reader)
        except Exception as e:
            # Equinox wraps errors with the leaf's path; report ours with it.
            cause = e
            while cause is not None and not isinstance(cause, _Mismatch):
                cause = cause.__cause__
            if cause is None:
                raise
            raise _Mismatch(f"{cause} ({e})") from None
        if f.read(1):
            raise reader._error(f"the file holds more than {reader.count} arrays")
    return model


def _read_header(f, path) -> dict[str, Any]:
    try:
        header = json.loads(f.readline().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"pinet_eqx.load({str(path)!r}): the first line is not a JSON header; "
            "was this file written by pinet_eqx.save?"
        ) from e
    if (
        not isinstance(header, dict)
        or header.get("format") != _FORMAT
        or header.get("format_version") != _FORMAT_VERSION
    ):
        raise ValueError(
            f"pinet_eqx.load({str(path)!r}): not a pinet_eqx file of format version "
            f"{_FORMAT_VERSION} (header {str(header)[:200]})."
        )
    return header


class _Mismatch(ValueError):
    """The skeleton does not match the file."""


class _Reader:
    """Reads each leaf, checking it against the skeleton's, so that a skeleton
    that does not match the file fails here, by name."""

    def __init__(self, path):
        self.path = path
        self.count = 0

    def __call__(self, f, x):
        if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
            stored = self._next(f)
            if stored.shape != x.shape or stored.dtype != x.dtype:
                raise self._error(
                    f"array {self.count} has shape {stored.shape} and dtype "
                    f"{stored.dtype} in the file, but {x.shape} and {x.dtype} in "
                    "the skeleton"
                )
            return stored if isinstance(x, np.ndarray) else jnp.asarray(stored)
        if isinstance(x, _SCALARS):
            return type(x)(self._next(f).item())
        return x

    def _next(self, f) -> np.ndarray:
        self.count += 1
        try:
            return np.load(f)
        except (ValueError, EOFError, OSError) as e:
            raise self._error(f"the file holds fewer arrays ({e})") from e

    def _error(self, what: str) -> ValueError:
        return _Mismatch(
            f"pinet_eqx.load({str(self.path)!r}): the model that `make` built does "
            f"not match the saved one: {what}. Check that `make` builds the same "
            "architecture from these hyperparameters."
        )
