"""The one thing pyproject.toml cannot say: the built-in recipes live in the top-level ``pipelines/``
folder (where users look for them) and ship in the wheel as the ``cachekit.pipelines`` package data.
Every other package is discovered under ``cachekit/``, never listed by hand."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["cachekit", "cachekit.*"]), "cachekit.pipelines"],
    package_dir={"cachekit.pipelines": "pipelines"},
    package_data={"cachekit": ["py.typed"], "cachekit.pipelines": ["*.toml"]},
)
