"""``python -m infra.modelserver serve --script FILE --data-dir DIR [--host H] [--port P]``."""

import sys

from infra.modelserver.cli import main

sys.exit(main(sys.argv[1:]))
