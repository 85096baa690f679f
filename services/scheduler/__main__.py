"""`python -m gearshift.scheduler`: run the scheduler daemon."""

import sys

from gearshift.scheduler.daemon import main

sys.exit(main())
