"""Packages for setuptools (the metadata is in pyproject.toml): txf, and the experiment files.

experiments/ ships inside the package as txf/experiments, so a non-editable install (a wheel,
``pip install .``) runs ``txf train --config default`` and every README command from anywhere
(txf.core.config.experiment_path finds them).
"""

from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["txf", "txf.*"]) + ["txf.experiments"],
      package_dir={"txf.experiments": "experiments"},
      package_data={"txf.experiments": ["*.py", "*.md", "*.sh"]})
