"""The second-order-cone benchmark (paper App. B.4).

Run it from the repository root with `python -m benchmarks.soc --help`. The
subcommands are `train` (train or set up, evaluate and time one method on one
size) and `report` (figures and tables from a results folder). It runs on the
shared harness, training loop and report of `benchmarks/_common`, as the DC3
suite does.
"""
