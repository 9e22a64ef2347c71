"""`python -m ckptkit.replay record MODEL.py -o TRACE.json [...]` and
`python -m ckptkit.replay apply MODEL.py TRACE.json PLAN.json [...]`: the MODEL.py command line
(ckptkit/replay/_cli.py; `record --help`, `apply --help`)."""
import sys

from ._cli import apply_main, record_main


def main(argv=None):
    """Dispatch to record or apply; returns the exit code (2 for an unknown command)."""
    argv = sys.argv[1:] if argv is None else argv
    commands = {"record": record_main, "apply": apply_main}
    if not argv or argv[0] not in commands:
        print("usage: python -m ckptkit.replay {record,apply} ... (record --help, apply --help)", file=sys.stderr)
        return 2
    name = "python -m ckptkit.replay " + argv[0]
    return commands[argv[0]](argv[1:], prog="ckptkit.replay " + argv[0], usage_name=name)


if __name__ == "__main__":
    sys.exit(main())
