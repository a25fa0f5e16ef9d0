"""``python -m collective.launch``: one worker process per device (see :mod:`collective.runtime.launcher`)."""

import sys

from collective.runtime.launcher import main

if __name__ == "__main__":
    sys.exit(main())
