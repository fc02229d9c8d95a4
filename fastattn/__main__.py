"""`python -m fastattn` / the `fastattn` console script."""
import sys


def main(argv=None):
    from . import show_config
    show_config()
    return 0


if __name__ == "__main__":
    sys.exit(main())
