"""``python -m svattn.cli``: the ``svattn`` command line (:func:`svattn.cli.main`)."""

import sys

from svattn.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
