"""The error types every layer may raise: a leaf module, importing nothing of the package."""
import importlib.util


class ConfigError(Exception):
    """A user mistake in the configuration: reported as one line, exit code 2, no traceback."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class MissingExtra(ConfigError):
    """What `key` asks for needs an optional package that is not installed: one line naming the extra of
    pyproject.toml that installs it. `what` reads before the package's name ("chat templates are rendered by")."""

    def __init__(self, key: str, what: str, package: str, extra: str):
        super().__init__(key, f"{what} {package}, which is not installed: pip install 'framework[{extra}]'")


def installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (an optional package may take seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):       # a missing parent package; a module set to None in sys.modules
        return False


def require_positive(cfg, *keys: str) -> None:
    """Each dotted key of `cfg` holds a positive number (a rule every owner's checks start from)."""
    for key in keys:
        value = cfg
        for part in key.split("."):
            value = getattr(value, part)
        if value is None or value <= 0:
            raise ConfigError(key, f"must be positive, got {value}")
