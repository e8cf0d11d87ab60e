"""Where the shipped config groups live: inside the package, so an installed wheel finds them anywhere."""
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[1] / "conf"
RECIPE_DIR = CONFIG_DIR / "recipe"
