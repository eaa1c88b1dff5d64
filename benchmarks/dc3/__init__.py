"""The DC3 benchmark suite (paper Sec. 3.1, App. B.1-B.2 and H.2-H.4): `data`,
`train`, `report` and `ablations` (the App. H.3/H.4/I.3/F.3 studies); see
`python -m benchmarks.dc3 --help`."""
