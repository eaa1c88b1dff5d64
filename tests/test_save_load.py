"""`examples/save_load.py`: save a trained network, load it in a fresh process."""

import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

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


def _hp(*keys, value):
    """Change one of the hyperparameters that `pe.save` stores in the header."""
    return _set("hyperparameters", *keys, value=value)


def _old_format(header):
    # Before `pe.save`, the example wrote its hyperparameters as the whole header.
    hp = header.pop("hyperparameters")
    header.clear()
    header.update(format="pinet_eqx-example-net", format_version=1, **hp)


def test_saved_file_is_a_pe_save_file(saved):
    head = json.loads((saved / "net.eqx").read_bytes().split(b"\n", 1)[0])
    assert head["format"] == "pinet_eqx" and head["jax_enable_x64"] is False
    assert head["hyperparameters"] == save_load.default_hyperparameters()


@pytest.mark.parametrize(
    "change, error, message",
    [
        (_set("format_version", value=2), ValueError, "not a pinet_eqx file"),
        (_old_format, ValueError, "not a pinet_eqx file"),
        (
            _hp("mlp", "width_size", value=32),
            ValueError,
            r"\(64, 10\) .* in the file, but \(32, 10\) .* in the skeleton"
            r".*'layers'\), SequenceKey\(idx=0\), GetAttrKey\(name='weight'",
        ),
        (
            _hp("mlp", "depth", value=3),
            ValueError,
            r"\(20, 64\) .* in the file, but \(64, 64\) .* in the skeleton"
            r".*'layers'\), SequenceKey\(idx=2\), GetAttrKey\(name='weight'",
        ),
        (
            _hp("problem", "seed", value=18),
            save_load.HeaderMismatchError,
            "constraints regenerated from the hyperparameters",
        ),
        (
            _hp("format", value="pinet_eqx-example-net"),
            save_load.HeaderMismatchError,
            r"hyperparameters \['dtype', 'format', .* are not this script's",
        ),
        (
            _set("jax_enable_x64", value=True),
            ValueError,
            r"saved with jax_enable_x64=True.*jax_enable_x64', True\)",
        ),
    ],
)
def test_mismatched_header_is_a_clear_error(saved, tmp_path, change, error, message):
    path = _with_header(saved, tmp_path, change)
    # The file is float32: load it as the example does (conftest.py turns on x64).
    with jax.enable_x64(False), pytest.raises(error, match=message):
        save_load.load(path)


def test_loading_in_the_other_precision_says_what_to_do(saved):
    # conftest.py turns on x64; the file was saved without it.
    assert jax.config.read("jax_enable_x64")
    with pytest.raises(ValueError, match=r"jax_enable_x64', False\)"):
        save_load.load(saved / "net.eqx")


def test_load_command_reports_a_bad_file(saved, tmp_path):
    path = _with_header(saved, tmp_path, _hp("mlp", "width_size", value=32))
    result = _example("load", path, "--reference", saved / "reference.npz")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "does not match the saved one" in result.stderr
    assert "Traceback" not in result.stderr


def test_truncated_or_padded_file_is_a_clear_error(saved, tmp_path):
    data = (saved / "net.eqx").read_bytes()
    # Cut inside an array. (Cutting only into the trailing Python scalar, the
    # projector's inference flag, is reported by Equinox's TreePathError.)
    (tmp_path / "short.eqx").write_bytes(data[: len(data) // 2])
    (tmp_path / "long.eqx").write_bytes(data + b"\0" * 8)
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match="the file holds fewer arrays"):
            save_load.load(tmp_path / "short.eqx")
        with pytest.raises(ValueError, match=r"the file holds more than \d+ arrays"):
            save_load.load(tmp_path / "long.eqx")
