"""``python -m journalq``: the ``journalq`` command, for when its script is not on PATH."""

from journalq.cli.main import main

main()
