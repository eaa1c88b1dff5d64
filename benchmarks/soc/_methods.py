"""The registry of methods the second-order-cone benchmark can run.

Each method is a module with `default_config(data) -> dict` and
`fit(data, config, seed, run) -> Trained`, as in the DC3 suite
(`benchmarks/dc3/_methods.py`), and optionally its own `time_inference`; the two
solver baselines are objects with that interface (`"module:attribute"`).
"""

from __future__ import annotations

import importlib

METHODS = {
    "pinet": "Our projection layer (pinet_eqx.HardConstrainedNet)",
    "cvxpylayers": "cvxpylayers (JAX interface, Clarabel) as the projection layer",
    "cvxpy": "SCS through a CVXPY DPP-parametrised problem, one instance at a time",
    "scs": "SCS called directly, one factorisation, update(b, c) per instance",
}
_MODULES = {
    "pinet": "_pinet",
    "cvxpylayers": "_cvxpylayers",
    "cvxpy": "_solvers:CVXPY",
    "scs": "_solvers:SCS",
}


def get(name: str):
    """The module implementing method `name`."""
    if name not in _MODULES:
        raise ValueError(f"Unknown method {name!r}; choose one of {tuple(METHODS)}.")
    module, _, attribute = _MODULES[name].partition(":")
    module = importlib.import_module(f"benchmarks.soc.{module}")
    return getattr(module, attribute) if attribute else module
