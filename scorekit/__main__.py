"""``python -m scorekit``: the ``scorekit`` command, for when the venv's scripts are not on PATH."""

import sys

from scorekit.cli import main

if __name__ == "__main__":
    sys.exit(main())
