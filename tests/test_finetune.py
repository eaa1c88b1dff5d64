"""`examples/finetune.py`: a small run of the fine-tuning example."""

import equinox as eqx
import jax
import numpy as np
import pytest

from examples import finetune


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finetune")
    argv = [
        "--pretrain-epochs=50",
        "--pretrain-batch-size=64",
        "--pretrain-lr=3e-3",
        "--finetune-epochs=2",
        "--n-train=512",
        "--n-valid=32",
        "--n-test=64",
        "--no-scratch",
        f"--out={out}",
    ]
    # In float32, as the example runs for users (conftest.py turns on float64).
    with jax.enable_x64(False):
        results = finetune.main(argv)
        X = results["X_test"].astype(np.float32)
        net = eqx.nn.inference_mode(results["finetuned"])
        results["Y_test"] = np.asarray(jax.vmap(net)(X, b=X))
    return results, out


def test_frozen_layer_is_bit_identical(run):
    results, _ = run
    before = results["pretrained"].layers[0]
    after = results["finetuned"].backbone.layers[0]
    for name in ("weight", "bias"):
        a, b = np.asarray(getattr(before, name)), np.asarray(getattr(after, name))
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), f"frozen layer's {name} changed"
    # ...while the layers after it were trained.
    for i in (1, 2):
        a = np.asarray(results["pretrained"].layers[i].weight)
        b = np.asarray(results["finetuned"].backbone.layers[i].weight)
        assert np.abs(a - b).max() > 1e-4, f"layer {i} did not change"


def test_finetuned_output_is_feasible(run):
    # Checked in float64 from A, G and h, independently of the projector.
    results, _ = run
    problem, X, Y = results["problem"], results["X_test"], results["Y_test"]
    assert Y.dtype == np.float32 and np.all(np.isfinite(Y))
    Y = Y.astype(np.float64)
    assert np.abs(Y @ problem.A.T - X).max() <= 1e-5
    assert (Y @ problem.G.T - problem.h).max() <= 1e-5


def test_finetuning_beats_projection_at_inference(run):
    metrics = run[0]["metrics"]
    # About 0.24 before and 0.03 after, in this small run.
    assert metrics["finetuned"]["rs_mean"] < 0.5 * metrics["inf"]["rs_mean"]
    # The projection makes Pinet-inf feasible where the raw MLP was not.
    assert metrics["inf"]["cv_max"] <= 1e-5 < metrics["raw"]["cv_max"]


def test_outputs_written(run):
    _, out = run
    for name in ("metrics.json", "finetune.png"):
        assert (out / name).stat().st_size > 0, name
