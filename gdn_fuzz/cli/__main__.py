"""`python -m gdn_fuzz.cli`: the gdn-fuzz command."""

import sys

from gdn_fuzz.cli import main

sys.exit(main())
