"""The DC optimal power flow (DC-OPF) benchmark on MATPOWER/PEGASE grids.

`_fixture` holds the problem data (`GridCase`, numpy/scipy only) and its `.npz`
format; `_data` builds a `GridCase` from a pandapower network and solves the
DC-OPF and the orthogonal projection onto its feasible set with Clarabel and OSQP.
"""
