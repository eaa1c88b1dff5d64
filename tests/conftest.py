import fnmatch

import jax
import pytest

# Strict global settings (house style): accuracy tests run in float64, and implicit
# rank promotion is an error so that broadcasting bugs cannot hide.
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

# Two tiers. `pytest` (pyproject's addopts: -m "not slow") runs the library's own
# tests; `pytest -m slow` runs the tests of the benchmark suites and the examples,
# which need the `bench` and `examples` extras, and the paper-scale cases of the
# library tests (marked `slow` where they are parametrised).
_SLOW_FILES = (
    "test_bench_*.py",  # in benchmarks/tests (its conftest loads this file)
    "test_finetune.py",
    "test_motion_planning.py",
    "test_toy_mpc.py",
    "test_save_load.py",
    "test_flax.py",
)


def _fast_tier(config) -> bool:
    return " ".join(config.getoption("markexpr", "").split()) == "not slow"


def pytest_configure(config):
    if _fast_tier(config):
        # The fast tier's problems are tiny: its time goes to XLA compiling them, not
        # to running them. (The slow tier keeps XLA's optimisations.)
        jax.config.update("jax_disable_most_optimizations", True)


def _is_slow_file(path) -> bool:
    return any(fnmatch.fnmatch(path.name, pattern) for pattern in _SLOW_FILES)


def pytest_ignore_collect(collection_path, config):
    # With the default `-m "not slow"` these files are not even imported: their
    # imports need the extras that `[test]` does not install.
    if _fast_tier(config) and _is_slow_file(collection_path):
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Before `-m` deselects: every test in those files is in the slow tier.
    for item in items:
        if _is_slow_file(item.path):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _host_solves_in_threads_where_patched(request):
    """A test that patches the library (`monkeypatch`) runs the host solves in
    this process's threads: the worker processes (`_linalg.host_processes`)
    import the library unpatched."""
    if "monkeypatch" in request.fixturenames:
        from pinet_eqx._linalg.host_processes import ENVIRONMENT

        request.getfixturevalue("monkeypatch").setenv(ENVIRONMENT, "0")
