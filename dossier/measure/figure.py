"""The speedup figure as every place prints it (imports nothing, so a command's help can use
it)."""


def speedup_text(speedup: float, low: float, high: float) -> str:
    """``1.234x [1.100, 1.380]``: a speedup and its interval."""
    return f"{speedup:.3f}x [{low:.3f}, {high:.3f}]"
