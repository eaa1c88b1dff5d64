"""Write the compatibility fixture: models saved by pinet_eqx at commit b155542.

Run once, from the repository root, with that commit's code:

    python tests/data/compat_b155542/make.py

Each model is written twice, with `pe.save` (its skeleton rebuilt by `build`
below) and with `pickle.dump` (which stores module paths such as
`pinet_eqx._projector`), and `expected.npz` holds the outputs that code gave.
`tests/test_compat.py` loads both with today's code and compares. This file
uses only the public API, so `build` also rebuilds the skeletons today.
"""

import pathlib
import pickle

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

import pinet_eqx as pe

HERE = pathlib.Path(__file__).parent
KINDS = ("dense_net", "sparse", "cones")
D = 8


def _polytope(seed: int, sparse: bool):
    rng = np.random.default_rng(seed)
    E = rng.standard_normal((3, D))
    C = rng.standard_normal((4, D))
    if sparse:
        E[np.abs(E) < 0.6] = 0.0
        C[np.abs(C) < 0.6] = 0.0
        E, C = sp.csr_matrix(E), sp.csr_matrix(C)
    return [
        pe.Equality(E, pe.Parameter("b")),
        pe.AffineInequality(C, lower=-np.ones(4), upper=np.ones(4)),
        pe.Box(lower=-2.0 * np.ones(D), upper=2.0 * np.ones(D)),
    ]


def build(kind: str, seed: int):
    """The skeleton of one fixture model (its arrays as at construction)."""
    if kind == "dense_net":
        backbone = eqx.nn.Linear(5, D, key=jax.random.key(seed))
        return pe.HardConstrainedNet(backbone, pe.Projector(_polytope(seed, False)))
    if kind == "sparse":
        return pe.Projector(_polytope(seed, True), affine_form="sparse")
    if kind == "cones":
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((3, D))
        return pe.Projector(
            [
                pe.SecondOrderCone(A, np.zeros(3), np.eye(D)[0], pe.Parameter("r")),
                pe.Simplex(indices=(4, 5, 6, 7), total=2.0),
            ]
        )
    raise ValueError(kind)


def inputs(kind: str):
    """Fixed inputs and per-instance parameters, two instances."""
    rng = np.random.default_rng(1)
    if kind == "dense_net":
        return rng.standard_normal((2, 5)), {"b": rng.standard_normal((2, 3))}
    if kind == "sparse":
        return 3.0 * rng.standard_normal((2, D)), {"b": rng.standard_normal((2, 3))}
    return 3.0 * rng.standard_normal((2, D)), {"r": np.array([1.0, 2.0])}


def outputs(model, kind: str) -> dict[str, np.ndarray]:
    """The model's outputs for `inputs(kind)`, in training and inference mode."""
    x, params = inputs(kind)
    out = {}
    for mode, m in (("train", model), ("infer", eqx.nn.inference_mode(model))):
        out[f"{kind}/{mode}"] = np.asarray(jax.vmap(lambda x, p: m(x, **p))(x, params))
    return out


def _trained(net):
    # A few gradient steps, so the saved backbone is not its initialisation.
    x, params = inputs("dense_net")
    spec = pe.trainable_filter(net)

    @eqx.filter_jit
    def step(net):
        def loss(diff, static):
            m = eqx.combine(diff, static)
            y = jax.vmap(lambda x, p: m(x, **p))(x, params)
            return jnp.sum((y - 1.0) ** 2)

        diff, static = eqx.partition(net, spec)
        grads = jax.grad(loss)(diff, static)
        return eqx.combine(jax.tree.map(lambda p, g: p - 0.05 * g, diff, grads), static)

    for _ in range(5):
        net = step(net)
    return net


def main():
    jax.config.update("jax_enable_x64", True)
    expected = {}
    for kind in KINDS:
        model = build(kind, seed=0)
        if kind == "dense_net":
            model = _trained(model)
        pe.save(HERE / f"{kind}.eqx", model, {"kind": kind, "seed": 0})
        with open(HERE / f"{kind}.pkl", "wb") as f:
            pickle.dump(model, f)
        expected.update(outputs(model, kind))
    np.savez(HERE / "expected.npz", **expected)


if __name__ == "__main__":
    main()
