"""``python -m db upgrade|downgrade|current|revision``: migrations from the command line.

The database is ``--url``, else ``DATABASE_URL``, else the default SQLite file.
"""

import argparse

from db import migrate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m db", description=__doc__)
    parser.add_argument("--url", help="database URL (default: DATABASE_URL or SQLite file)")
    commands = parser.add_subparsers(dest="command", required=True)
    upgrade = commands.add_parser("upgrade", help="upgrade to a revision (default: head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    downgrade = commands.add_parser("downgrade", help="downgrade to a revision ('base': empty)")
    downgrade.add_argument("revision")
    commands.add_parser("current", help="print the current revision")
    revision = commands.add_parser("revision", help="autogenerate a revision from the models")
    revision.add_argument("-m", "--message", required=True)
    args = parser.parse_args(argv)

    if args.command == "upgrade":
        migrate.upgrade(args.url, args.revision)
    elif args.command == "downgrade":
        migrate.downgrade(args.url, args.revision)
    elif args.command == "current":
        migrate.current(args.url)
    else:
        migrate.revision(args.message, args.url)


if __name__ == "__main__":
    main()
