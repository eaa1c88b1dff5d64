"""The DC3 benchmark suite (paper Sec. 3.1, App. B.1-B.2 and H.2-H.4).

Run it from the repository root with `python -m benchmarks.dc3 --help`. The
subcommands are `data` (generate the problems and cache their optimal solutions),
`train` (train and evaluate one method on one problem), `report` (figures and
tables from a results folder) and `ablations` (the App. H.3/H.4/I.3/F.3 studies).
"""
