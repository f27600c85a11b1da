import sys

from rl.cli import main

sys.exit(main())
