"""`python -m gearshift.shardmanager`: run the shardmanager daemon."""

import sys

from gearshift.shardmanager.daemon import main

sys.exit(main())
