"""``python -m imgdiff A B [...]``: same as the ``imgdiff`` console script."""

import sys

from imgdiff.cli import main

sys.exit(main())
