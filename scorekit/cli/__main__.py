"""``python -m scorekit.cli``: the same as ``python -m scorekit``."""

import sys

from scorekit.cli import main

if __name__ == "__main__":
    sys.exit(main())
