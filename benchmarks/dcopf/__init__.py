"""The DC optimal power flow (DC-OPF) benchmark on MATPOWER grids (PEGASE,
ACTIVSg): the projection, proxies trained through it, and their baselines."""
