"""``python -m jupyter_dist.node``: the line every launcher runs on a node."""

import sys

from jupyter_dist.node.agent import main

if __name__ == "__main__":
    sys.exit(main())
