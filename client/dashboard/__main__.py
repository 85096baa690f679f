"""`python -m gearshift.client.dashboard` (as `gearshift dashboard`)."""

import sys

from gearshift.client.dashboard.server import main

sys.exit(main())
