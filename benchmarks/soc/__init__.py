"""The second-order-cone benchmark (paper App. B.4).

Run it from the repository root with `python -m benchmarks.soc --help`: `train`
(one method on one size) and `report` (figures and tables from a results folder).
"""
