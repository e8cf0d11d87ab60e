"""The error types every layer may raise: a leaf module, importing nothing of the package."""


class ConfigError(Exception):
    """A user mistake in the configuration: reported as one line, exit code 2, no traceback."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
