"""`pe.save` / `pe.load`: a JSON header plus the leaves."""

import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pinet_eqx as pe


def make(width, seed, n_var=6, n_eq=2):
    """A small constrained network; the constraint data regenerate from `seed`."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n_eq, n_var))
    proj = pe.Projector(
        [pe.Equality(A, pe.Parameter("b")), pe.Box(-1.0, np.inf)], n_iter=30
    )
    mlp = eqx.nn.MLP(n_eq, n_var, width, 1, key=jax.random.key(seed))
    return pe.HardConstrainedNet(mlp, proj)


def _perturbed(net):
    # Change the weights so that a load into a fresh skeleton is distinguishable.
    return eqx.tree_at(
        lambda n: n.backbone.layers[0].weight,
        net,
        replace_fn=lambda w: w + 0.25,
    )


def test_round_trip_is_bit_identical(tmp_path):
    hp = {"width": 8, "seed": 3}
    net = _perturbed(make(**hp)).projector.with_settings(n_iter=45)
    net = _perturbed(make(**hp))
    path = tmp_path / "net.eqx"
    pe.save(path, net, hp)
    loaded = pe.load(path, make)
    x = jnp.asarray([0.1, -0.2])
    assert np.array_equal(np.asarray(net(x, b=x)), np.asarray(loaded(x, b=x)))
    assert not np.array_equal(
        np.asarray(make(**hp)(x, b=x)), np.asarray(loaded(x, b=x))
    )
    # A skeleton of shapes only works too.
    shapes = pe.load(path, lambda **hp: eqx.filter_eval_shape(make, **hp))
    assert np.array_equal(
        np.asarray(shapes.backbone.layers[0].weight),
        np.asarray(net.backbone.layers[0].weight),
    )


def test_wrong_skeleton_is_a_clear_error(tmp_path):
    path = tmp_path / "net.eqx"
    pe.save(path, make(8, 0), {"width": 8, "seed": 0})
    with pytest.raises(ValueError, match="does not match the saved one"):
        pe.load(path, lambda width, seed: make(width + 1, seed))
    with pytest.raises(ValueError, match="does not match the saved one"):
        pe.load(path, lambda width, seed: make(width, seed, n_var=7))


def test_bad_files_and_hyperparameters_are_clear_errors(tmp_path):
    path = tmp_path / "other.eqx"
    path.write_bytes(b"\x93NUMPY not a header")
    with pytest.raises(ValueError, match="not a JSON header"):
        pe.load(path, make)
    path.write_text('{"format": "something else"}\n')
    with pytest.raises(ValueError, match="not a pinet_eqx file"):
        pe.load(path, make)
    with pytest.raises(TypeError, match="JSON-serialisable"):
        pe.save(tmp_path / "x.eqx", make(8, 0), {"A": np.ones(3)})


def test_loading_in_the_other_precision_says_what_to_do(tmp_path):
    """The tests run with x64 on; a fresh process with x64 off cannot read the
    float64 arrays and says how to fix it."""
    path = tmp_path / "net.eqx"
    pe.save(path, make(8, 0), {"width": 8, "seed": 0})
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import pinet_eqx as pe
        from test_serialise import make
        try:
            pe.load({str(path)!r}, make)
        except ValueError as e:
            print(e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert "jax_enable_x64=True" in out.stdout, out.stderr
    assert "jax.config.update('jax_enable_x64', True)" in out.stdout


@pytest.mark.parametrize("cut", [3, 200])
def test_truncated_or_padded_files_are_clear_errors(tmp_path, cut):
    path = tmp_path / "net.eqx"
    pe.save(path, make(8, 0), {"width": 8, "seed": 0})
    data = path.read_bytes()
    # Cut inside the last stored value (a Python scalar), or deeper.
    path.write_bytes(data[:-cut])
    with pytest.raises(ValueError, match="fewer arrays"):
        pe.load(path, make)
    path.write_bytes(data + data[-cut:])
    with pytest.raises(ValueError, match="more than"):
        pe.load(path, make)
