"""What must survive a reorganisation of the library's private modules.

- Models written by the code of commit b155542 (`tests/data/compat_b155542`,
  made by its `make.py`) load, with `pe.load` and with `pickle.load`, and give
  the outputs that code gave. A pickle stores the module path of every class
  (`pinet_eqx._projector.Projector`), so this checks the old paths still import,
  for every class those modules defined (`classes.json`).
- The public namespace is the one captured at that commit: the same names, and
  the same signatures.
"""

import importlib
import importlib.util
import inspect
import json
import pathlib
import pickle
import types

import equinox as eqx
import numpy as np
import pytest

import pinet_eqx as pe
import pinet_eqx.problems

_DATA = pathlib.Path(__file__).parent / "data"
_FIXTURE = _DATA / "compat_b155542"


def _make_module():
    spec = importlib.util.spec_from_file_location("compat_make", _FIXTURE / "make.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_MAKE = _make_module()


def _load(kind: str, how: str):
    if how == "pe.load":
        return pe.load(_FIXTURE / f"{kind}.eqx", _MAKE.build)
    with open(_FIXTURE / f"{kind}.pkl", "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("how", ["pe.load", "pickle"])
@pytest.mark.parametrize("kind", _MAKE.KINDS)
def test_models_saved_before_the_move_load_and_agree(kind, how):
    model = _load(kind, how)
    expected = np.load(_FIXTURE / "expected.npz")
    got = _MAKE.outputs(model, kind)
    assert set(got) == {k for k in expected.files if k.startswith(f"{kind}/")}
    for key, value in got.items():
        np.testing.assert_allclose(value, expected[key], rtol=1e-9, atol=1e-9)
    if kind == "dense_net":
        assert isinstance(model, pe.HardConstrainedNet)
    else:
        assert isinstance(model, pe.Projector)
    assert eqx.tree_equal(
        jax_structure(model), jax_structure(_MAKE.build(kind, seed=0))
    )


def test_old_module_paths_resolve():
    # Every class the modules of b155542 defined, by the path a pickle stores.
    with open(_FIXTURE / "classes.json") as f:
        classes = json.load(f)
    for module, names in classes.items():
        old = importlib.import_module(module)
        for name in names:
            obj = getattr(old, name)
            assert isinstance(obj, type) and obj.__name__ == name, (module, name)


def jax_structure(model):
    return eqx.filter(model, eqx.is_array, inverse=True)


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""


def public_api() -> dict[str, dict[str, str]]:
    """Every public name of `pinet_eqx` and `pinet_eqx.problems`: its kind and,
    for callables, its signature."""
    api = {}
    for module in (pe, pinet_eqx.problems):
        names = {}
        for name in sorted(dir(module)):
            obj = getattr(module, name)
            if name.startswith("_") or isinstance(obj, types.ModuleType):
                continue
            kind = "class" if isinstance(obj, type) else type(obj).__name__
            names[name] = f"{kind} {_signature(obj) if callable(obj) else ''}".strip()
        api[module.__name__] = names
    return api


def test_public_names_unchanged():
    with open(_DATA / "public_api_b155542.json") as f:
        expected = json.load(f)
    assert public_api() == expected


if __name__ == "__main__":
    # Capture the public API (run once, with the code whose API is the reference).
    import jax

    jax.config.update("jax_enable_x64", True)
    with open(_DATA / "public_api_b155542.json", "w") as f:
        json.dump(public_api(), f, indent=1, sort_keys=True)
        f.write("\n")
