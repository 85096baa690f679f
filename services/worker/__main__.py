"""`python -m gearshift.worker`: run the worker daemon."""

import sys

from gearshift.worker.daemon import main

sys.exit(main())
