"""``python -m srifty_core.cli``: the ``srifty`` command."""

import sys

from srifty_core.cli import main

if __name__ == "__main__":
    sys.exit(main())
