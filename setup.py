"""The one packaging step pyproject.toml cannot say: ship the top-level `data/` in the wheel.

`data/` (the bundled model, tokenizer and transcoder sets) stays the one copy, at the root of
the repository. The wheel carries it as package data of `attrgraph._data`, mapped onto `data/`,
so an installed copy holds it at `site-packages/attrgraph/_data/`; the sdist carries `data/`
as it is. `transcoders.paths.data_dir()` finds either. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["attrgraph*", "transcoders*"]) + ["attrgraph._data"],
    package_dir={"attrgraph._data": "data"},
    package_data={"attrgraph._data": ["**/*"]},
    include_package_data=False,  # package_data says it all; else setuptools takes data/default for a package
)
