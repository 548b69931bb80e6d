"""``python -m agui_hub.cli``: the ``agui-hub`` command."""

import sys

from . import main

sys.exit(main())
