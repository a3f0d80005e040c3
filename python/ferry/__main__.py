"""`python -m ferry COMMAND ...`: the package's commands, for when only Python is on the PATH.

    python -m ferry run ...      the `ferry run` supervisor (ferry/bin/ferry)
    python -m ferry shm ...      ferry-shm: shared-memory checks and clean-up (ferry/bin/ferry-shm)
    python -m ferry host ...     this machine takes tasks from a ferry.Pool elsewhere (Python)
    python -m ferry --version
"""

import sys

_USAGE = ("usage: python -m ferry run [options]     (ferry run --help)\n"
          "       python -m ferry shm [check|ls|clean] [options]\n"
          "       python -m ferry host --join ADDRESS:PORT [options]\n"
          "       python -m ferry --version")


def _main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "--version":
        from . import __version__
        print(__version__)
        return 0
    if command == "host":
        from ._host import main
        return main(rest)
    if command in ("run", "shm"):
        import _ferry_commands
        if command == "run":
            _ferry_commands.run("ferry", ["run", *rest])
        _ferry_commands.run("ferry-shm", rest)
    print(f"python -m ferry: unknown command {command!r}\n{_USAGE}", file=sys.stderr)
    return 2


sys.exit(_main(sys.argv[1:]))
