"""The second-order-cone benchmark (paper App. B.4): `train` (one method on one
size) and `report`; see `python -m benchmarks.soc --help`."""
