"""Tests of the benchmark suites, kept beside them (as optimistix keeps its
benchmarks out of `tests/`).

They run under the library tests' strict settings and tiers, which live in
`tests/conftest.py`; it is loaded here too, so that a run of this folder alone
(`pytest benchmarks/tests -m slow`) gets them. As there, `test_bench_*.py` are
the slow tier (`pytest -m slow`, with the `bench` extra) and are not even
imported in the fast tier; the other files here (the ACTIVSg data and the DC-OPF
proxy, which the `test` extra covers) are in the fast tier, their paper-scale
cases marked `slow`. Shared helpers come from `tests/helpers.py` (`tests` is on
pytest's `pythonpath`, `pyproject.toml`).
"""

import importlib.util
import pathlib

_path = pathlib.Path(__file__).parents[2] / "tests" / "conftest.py"
_spec = importlib.util.spec_from_file_location("_library_conftest", _path)
_library = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_library)

pytest_configure = _library.pytest_configure
pytest_ignore_collect = _library.pytest_ignore_collect
pytest_collection_modifyitems = _library.pytest_collection_modifyitems
