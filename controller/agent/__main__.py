"""``python -m controller.agent``: the same command as ``python -m controller agent``."""

from controller.agent.cli import agent

if __name__ == "__main__":
    agent(prog_name="python -m controller.agent")
