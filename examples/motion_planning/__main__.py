"""`python -m examples.motion_planning ...` (see the package docstring)."""

from ._cli import main

main()
