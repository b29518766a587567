"""`python -m lsan`: the same as the `lsan` command."""

import sys

from lsan.cli import main

sys.exit(main())
