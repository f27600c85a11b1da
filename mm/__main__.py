import sys

from mm.cli import main

sys.exit(main())
