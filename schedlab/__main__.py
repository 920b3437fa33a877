"""``python -m schedlab``: the same command as ``schedlab``."""

import sys

from .cli import main

sys.exit(main())
