"""Packaging beside pyproject.toml: conf/ and recipes/ stay at the top of the repository and ship inside
the package as framework/conf (recipes/ as its `recipe` group), so a wheel runs from any directory; the data
the tiny recipes train on ships in framework/data/assets, the offline benchmark tasks in framework/evaluation/shipped."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["framework*"]) + ["framework.conf", "framework.conf.recipe"],
    package_dir={"framework.conf": "conf", "framework.conf.recipe": "recipes"},
    package_data={"framework.conf": ["**/*.yaml"], "framework.conf.recipe": ["*.yaml"],
                  "framework.data.assets": ["*.jsonl"], "framework.evaluation.shipped": ["*.yaml", "*.jsonl"]},
)
