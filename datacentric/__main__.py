"""``python -m datacentric ...`` (also under ``torchrun -m datacentric``)."""

import sys

from datacentric.cli.main import main

sys.exit(main())
