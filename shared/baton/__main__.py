"""``python -m baton``: the same command line as the ``baton`` script."""

from baton.cli import main

main()
