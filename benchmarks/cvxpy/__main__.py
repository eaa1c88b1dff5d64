"""Command line of the cvxpy front-end benchmark (see the package docstring):
writes `OUT/results.json` (every number, the machine and the command) and
`OUT/results.md` (the tables), and prints the tables.

    python -m benchmarks.cvxpy [--batch 64] [--repeats 20] [--out results/cvxpy]
    python -m benchmarks.cvxpy --quick --out /tmp/cvxpy     # smoke run
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib

DEFAULT_OUT = pathlib.Path("results") / "cvxpy"
PARTS = ("speed", "overhead", "native_sets", "partial_sums", "accuracy")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cvxpy",
        description="pe.from_cvxpy against cvxpylayers (target A) and against "
        "hand-built sets (target B), issue 31.",
    )
    add = parser.add_argument
    add("--batch", type=int, default=64)
    add("--repeats", type=int, default=20, help="timed repeats of every call")
    add("--dc3-size", choices=("small", "tiny"), default="small", help="target B")
    add("--only", choices=PARTS, action="append", help="run only these parts")
    no_clarabel = "target A without the Clarabel variant of cvxpylayers"
    add("--no-clarabel", action="store_true", help=no_clarabel)
    add(
        "--quick",
        action="store_true",
        help="smoke run: batch 4, 2 repeats, DC3 tiny, no Clarabel cvxpylayers; "
        "without --only, targets A and B only",
    )
    add("--out", type=pathlib.Path, default=DEFAULT_OUT)
    return parser


def source_digest() -> str:
    """SHA-256 (first 12 hex digits) of the library's source files: which
    state of `pinet_eqx/` produced the numbers, uncommitted edits included."""
    root = pathlib.Path(__file__).resolve().parents[2] / "pinet_eqx"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def main(argv=None) -> dict:
    args = _parser().parse_args(argv)
    if args.batch < 1 or args.repeats < 1:
        raise SystemExit("--batch and --repeats must be at least 1.")
    parts = args.only or list(PARTS)
    if args.quick:
        args.batch, args.repeats, args.dc3_size = 4, 2, "tiny"
        args.no_clarabel = True
        parts = args.only or ["speed", "overhead"]

    import jax

    jax.config.update("jax_enable_x64", True)

    from .._common.provenance import command_line, log, machine, save
    from . import _accuracy, _measure, _report

    record = {
        "command": command_line("python -m benchmarks.cvxpy", argv),
        "machine": machine(),
        "pinet_eqx_source": source_digest(),
        "dtype": "float64",
        "quick": args.quick,
    }
    batch, repeats, quick = args.batch, args.repeats, args.quick
    measures = {
        "speed": lambda: _measure.measure_speed(batch, repeats, not args.no_clarabel),
        "overhead": lambda: _measure.measure_dc3(args.dc3_size, batch, repeats),
        "native_sets": lambda: _measure.measure_native_sets(batch, repeats),
        "partial_sums": lambda: _measure.measure_partial_sums(batch),
        "accuracy": lambda: _accuracy.run(4 if quick else 32, 1 if quick else 4),
    }
    for part in PARTS:
        if part in parts:
            record[part] = measures[part]()
    record["machine_after"] = {"load_avg": machine()["load_avg"]}

    save(args.out / "results.json", record)
    table = _report.markdown(record)
    (args.out / "results.md").write_text(table)
    print(table)
    log(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return record


if __name__ == "__main__":
    main()
