"""`examples/save_load.py`: save a trained network, load it in a fresh process."""

import json
import pathlib
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest

import pinet_eqx as pe
from examples import save_load

_EXAMPLE = pathlib.Path(save_load.__file__)


def _example(*args):
    return subprocess.run(
        [sys.executable, str(_EXAMPLE), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("save_load")
    result = _example("save", "--steps", 20, "--out", out)
    assert result.returncode == 0, result.stderr
    for name in ("net.eqx", "net.pkl", "reference.npz"):
        assert (out / name).stat().st_size > 0, name
    return out


@pytest.mark.parametrize(
    "command, name", [("load", "net.eqx"), ("unpickle", "net.pkl")]
)
def test_round_trip_in_a_fresh_process_is_bit_identical(saved, command, name):
    result = _example(command, saved / name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit-identical" in result.stdout


def test_comparison_sees_one_ulp(saved, tmp_path):
    # The bit-for-bit check itself: one output moved by one ulp must fail it.
    ref = dict(np.load(saved / "reference.npz"))
    ref["Y"] = ref["Y"].copy()
    ref["Y"][3, 5] = np.nextafter(ref["Y"][3, 5], np.inf)
    np.savez(tmp_path / "reference.npz", **ref)
    result = _example(
        "load", saved / "net.eqx", "--reference", tmp_path / "reference.npz"
    )
    assert result.returncode == 1
    assert "DIFFERENT" in result.stdout


def _with_header(saved, tmp_path, change):
    head, rest = (saved / "net.eqx").read_bytes().split(b"\n", 1)
    header = json.loads(head)
    change(header)
    path = tmp_path / "net.eqx"
    path.write_bytes(json.dumps(header).encode() + b"\n" + rest)
    return path


def _set(*keys, value):
    def change(header):
        d = header
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


@pytest.mark.parametrize(
    "change, message",
    [
        (_set("format_version", value=2), "version 2, but this script reads"),
        (_set("mlp", "width_size", value=32), r"layers\[0\].weight\) has shape"),
        (_set("mlp", "depth", value=3), r"layers\[2\].weight\) has shape"),
        (_set("problem", "seed", value=18), "constraints regenerated from the header"),
    ],
)
def test_mismatched_header_is_a_clear_error(saved, tmp_path, change, message):
    path = _with_header(saved, tmp_path, change)
    # The file is float32: load it as the example does (conftest.py turns on x64).
    with (
        jax.enable_x64(False),
        pytest.raises(save_load.HeaderMismatchError, match=message),
    ):
        save_load.load(path)


def test_header_from_before_adjoint_still_loads(saved, tmp_path):
    # Older files store the backward step limit as `n_iter_bwd`: it is mapped onto
    # the adjoint, without the deprecated Projector keyword.
    path = _with_header(saved, tmp_path, _set("projector", "n_iter_bwd", value=100))
    with jax.enable_x64(False), warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        net, _, _ = save_load.load(path)
    assert net.projector.adjoint == pe.ImplicitAdjoint(max_steps=100)


def test_truncated_or_padded_file_is_a_clear_error(saved, tmp_path):
    data = (saved / "net.eqx").read_bytes()
    (tmp_path / "short.eqx").write_bytes(data[:-100])
    (tmp_path / "long.eqx").write_bytes(data + b"\0" * 8)
    with jax.enable_x64(False):
        with pytest.raises(save_load.HeaderMismatchError, match="the file ends before"):
            save_load.load(tmp_path / "short.eqx")
        with pytest.raises(save_load.HeaderMismatchError, match="bytes are left after"):
            save_load.load(tmp_path / "long.eqx")
