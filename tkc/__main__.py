"""``python -m tkc``: the same CLI as the ``tkc`` script, for checkouts that are not installed."""

from tkc.cli import main

main()
