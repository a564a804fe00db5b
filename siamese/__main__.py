"""``python -m siamese …``: see :mod:`siamese.cli`."""

import sys

from .cli import main

sys.exit(main())
