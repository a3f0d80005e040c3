"""`python3 -m ferry host ...`: this machine takes tasks from a ferry.Pool elsewhere."""

import sys


def _main(argv):
    if not argv or argv[0] != "host":
        print("usage: python3 -m ferry host --join ADDRESS:PORT [options] (--help for them)",
              file=sys.stderr)
        return 2
    from ._host import main
    return main(argv[1:])


sys.exit(_main(sys.argv[1:]))
