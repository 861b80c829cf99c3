"""The interpreter's error: a kernel did something that is an error or undefined on a GPU."""


class InterpreterError(RuntimeError):
    """Raised for what cuTile rejects or leaves undefined; the message names the kernel, the
    program (its block index) and the tile."""
