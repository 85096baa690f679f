"""`python -m gearshift.brain`: run the brain daemon."""

import sys

from gearshift.brain.daemon import main

sys.exit(main())
