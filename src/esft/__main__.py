"""`python -m esft ...` is the `esft` command."""

import sys

from esft.cli import main

if __name__ == "__main__":
    sys.exit(main())
