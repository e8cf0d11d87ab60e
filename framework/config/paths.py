"""Where the config groups live. In the repository they are conf/ and recipes/ at its top (conf/recipe
links to recipes/); a built wheel carries them inside the package as framework/conf (setup.py maps
them there), so an installed `framework` finds them from any directory."""
from pathlib import Path

_PACKAGED = Path(__file__).resolve().parents[1] / "conf"
_CHECKOUT = Path(__file__).resolve().parents[2] / "conf"

CONFIG_DIR = _PACKAGED if (_PACKAGED / "config.yaml").exists() else _CHECKOUT
RECIPE_DIR = CONFIG_DIR / "recipe"
