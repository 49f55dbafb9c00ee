"""`python -m stepscope` is the `stepscope` command."""

import sys

from stepscope.cli.main import main

sys.exit(main())
