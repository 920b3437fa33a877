"""``python -m schedlab``: the same command as ``schedlab``."""

import sys

from .entry import main

if __name__ == "__main__":
    sys.exit(main())
