"""`HardConstrainedNet`: a backbone followed by a projection layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.tree_util as jtu
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from ._projector.projector import Projector


class HardConstrainedNet(eqx.Module):
    """A network whose outputs satisfy hard convex constraints by construction.

    Computes $y = \\Pi_{\\mathcal{C}(x)}(f_\\theta(x))$: any Equinox backbone
    $f_\\theta$ (for example `eqx.nn.MLP`, or a pretrained network) followed by a
    `Projector`.
    Train it end to end with optax, keeping the projector's frozen arrays away from
    the optimiser with `trainable_filter`.

    **Arguments:**

    - `backbone`: a callable Module mapping one input `x` to a raw output of shape
        `(d,)`. If it takes a `key` (dropout), pass `key=` to the call.
    - `projector`: the `Projector` applied to the backbone's output.
    """

    backbone: Callable
    projector: Projector

    def __check_init__(self):
        if not isinstance(self.projector, Projector):
            raise TypeError(
                "HardConstrainedNet(backbone, projector): `projector` must be a "
                f"pinet_eqx.Projector, got {type(self.projector).__name__}."
            )
        if not callable(self.backbone):
            raise TypeError(
                "HardConstrainedNet(backbone, projector): `backbone` must be callable "
                f"(an Equinox Module), got {type(self.backbone).__name__}."
            )

    def __call__(
        self, x, *, key: PRNGKeyArray | None = None, **params
    ) -> Float[Array, " d"]:
        """Map one input to a feasible output.

        **Arguments:**

        - `x`: one input (batch with `jax.vmap`).
        - `key`: optional PRNG key forwarded to the backbone.
        - `**params`: the projector's per-instance parameters (e.g. `b=x`).

        **Returns:** $y \\in \\mathcal{C}$, shape `(d,)`.
        """
        y_raw = self.backbone(x) if key is None else self.backbone(x, key=key)
        return self.projector(y_raw, **params)

    def raw(self, x, *, key: PRNGKeyArray | None = None) -> Float[Array, " d"]:
        """The backbone's output before projection (e.g. for a soft-penalty warm-up)."""
        return self.backbone(x) if key is None else self.backbone(x, key=key)


def trainable_filter(
    model: PyTree, frozen: Callable[[PyTree], Any] | None = None
) -> PyTree[bool]:
    """A filter spec marking what an optimiser may update.

    Inexact (floating) arrays are trainable, except those inside any `Projector`
    (its factorisations and scalings are fixed at construction) and those inside the
    sub-trees selected by `frozen`. Use it with `eqx.partition`:

    ```python
    params, static = eqx.partition(net, pinet_eqx.trainable_filter(net))
    ```

    Because frozen arrays never reach the optimiser, even decoupled weight decay
    (`optax.adamw`) leaves them bit-identical.

    **Arguments:**

    - `model`: any PyTree, typically a `HardConstrainedNet`.
    - `frozen`: optional function selecting sub-trees to freeze, in the style of
        `eqx.tree_at`, e.g. `lambda m: m.backbone.layers[0]` or
        `lambda m: (m.backbone.layers[0].weight, m.backbone.layers[0].bias)`.

    **Returns:** a PyTree of bools with the structure of `model`.
    """

    def spec(node):
        if isinstance(node, Projector):
            return jtu.tree_map(lambda _: False, node)
        return eqx.is_inexact_array(node)

    filter_spec = jtu.tree_map(
        spec, model, is_leaf=lambda node: isinstance(node, Projector)
    )
    if frozen is not None:
        filter_spec = eqx.tree_at(
            frozen,
            filter_spec,
            replace_fn=lambda sub: jtu.tree_map(lambda _: False, sub),
        )
    return filter_spec
