"""`python -m tandem.server ...` is `tandem serve ...`."""

import sys

from .cli import main

sys.exit(main())
