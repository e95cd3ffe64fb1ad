"""``python -m colo_fsm.demo``."""

import sys

from colo_fsm.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())
