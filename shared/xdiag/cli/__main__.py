"""`python -m xdiag.cli`, as the `xdiag` console script."""

from xdiag.cli import main

main()
