"""Shim so Beam remote runners can stage the project with `--setup_file ./setup.py`.

All metadata lives in pyproject.toml; Beam builds an sdist from this file and installs it on every worker.
"""

from setuptools import setup

setup()
