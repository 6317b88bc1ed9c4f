"""`python -m controller`."""

from controller.cli import main

if __name__ == "__main__":
    main(prog_name="python -m controller")
