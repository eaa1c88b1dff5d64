"""Named per-instance data for constraint sets."""

from __future__ import annotations

import equinox as eqx

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
    """

    name: str = eqx.field(static=True)

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
