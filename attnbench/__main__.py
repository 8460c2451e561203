"""``python3 -m attnbench`` = the ``attnbench`` command (run under its supervising process).

``main`` is the console script's entry point too. ``--version`` is answered here, before
the command line package (typer, rich, every command) is imported: 0.1 s less CPU.
"""
import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from attnbench import __version__

        print(f"attnbench {__version__}")
        return
    from attnbench.cli.supervise import main as supervised_main

    supervised_main()


if __name__ == "__main__":
    main()
