"""``python -m schedlab``: the same command as ``schedlab``."""

import sys

from .entry import main

sys.exit(main())
