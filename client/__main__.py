"""``python -m statehouse.client``: the ``statehouse`` command line."""

import sys

from statehouse.client.cli import main

sys.exit(main())
