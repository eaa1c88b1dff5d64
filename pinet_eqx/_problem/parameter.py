"""Named per-instance data for constraint sets."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np

# Keyword names that `Projector.__call__`/`solve` and `HardConstrainedNet.__call__`
# already use; a parameter with one of these names could never be passed.
RESERVED_NAMES = frozenset({"y_raw", "y", "s0", "key", "x"})


class Parameter(eqx.Module):
    """A named placeholder for a vector that changes from one instance to the next.

    Use it wherever a constraint takes a vector datum (`b`, `lower`, `upper`): the
    value is then supplied at call time, `proj(y_raw, name=value)`, one instance at a
    time (batch with `jax.vmap`). This mirrors `cvxpy.Parameter`: the projector is
    built (lifted, equilibrated, factorised) once, and contexts enter only through
    these values.

    **Arguments:**

    - `name`: the keyword under which the value is passed. Must be a Python
        identifier and not one of `y_raw`, `y`, `s0`, `key`, `x`.
    - `shape`: the shape of one instance's value. Optional for vectors and scalars
        (the constraint infers it, and checks it when given); required for
        per-instance matrices, e.g. `Parameter("A", shape=(m, d))`, because their
        row count sizes the lifted problem.
    """

    name: str = eqx.field(static=True)
    shape: tuple[int, ...] | None = eqx.field(static=True, default=None)

    def __init__(self, name: str, shape: tuple[int, ...] | None = None):
        self.name = name
        if shape is not None:
            try:
                shape = tuple(int(n) for n in shape)
            except TypeError as e:
                raise TypeError(
                    f"Parameter({name!r}, shape={shape!r}): `shape` must be a tuple "
                    "of ints such as (m, d), or None."
                ) from e
        self.shape = shape

    def __check_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(
                f"Parameter(name={self.name!r}): the name must be a valid Python "
                "identifier, because it is passed as a keyword, e.g. "
                "`proj(y_raw, b=...)`."
            )
        if self.name in RESERVED_NAMES:
            raise ValueError(
                f"Parameter(name={self.name!r}): this name is reserved by the "
                f"projector's call signature ({sorted(RESERVED_NAMES)}); choose "
                "another name."
            )
        if self.shape is not None and (
            len(self.shape) > 2 or any(n < 1 for n in self.shape)
        ):
            raise ValueError(
                f"Parameter({self.name!r}, shape={self.shape}): a parameter is a "
                "scalar `()`, a vector `(k,)` or a matrix `(m, d)` with positive "
                "sizes."
            )


def shape_of(value) -> tuple[int, ...]:
    """The (declared) shape of a fixed array or a `Parameter`."""
    if isinstance(value, Parameter):
        # Declared for matrices (`as_matrix`) and cone offsets (`lift`).
        assert value.shape is not None
        return value.shape
    return np.shape(value)


def check_values(parameters, values: dict, note: str = "") -> dict:
    """`values` as JAX arrays, checked against the declared `parameters` (the
    `(name, shape)` pairs): exactly those names, each of its shape for one
    instance. `note` ends the message of a name mismatch."""
    expected = dict(parameters)
    missing = sorted(set(expected) - set(values))
    unknown = sorted(set(values) - set(expected))
    if missing or unknown:
        parts = [f"missing {missing}"] * bool(missing)
        parts += [f"unknown {unknown}"] * bool(unknown)
        raise TypeError(
            f"Projector: parameter mismatch ({'; '.join(parts)}). This projector "
            f"expects exactly {sorted(expected) or 'no parameters'} as keyword "
            f"arguments{note}."
        )
    out = {}
    for name, shape in expected.items():
        v = jnp.asarray(values[name])
        if v.shape != shape:
            hint = (
                " To batch, vmap over instances instead of passing a batch."
                if v.ndim == len(shape) + 1 and v.shape[1:] == shape
                else ""
            )
            raise ValueError(
                f"Projector: parameter `{name}` must have shape {shape} for one "
                f"instance, got {v.shape}.{hint}"
            )
        out[name] = v
    return out
