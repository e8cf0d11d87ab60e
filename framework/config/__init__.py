from framework.config.errors import ConfigError

__all__ = ["ConfigError"]
