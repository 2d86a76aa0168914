"""petri's version: the one place it is written. The build reads it from here
(``[tool.setuptools.dynamic]`` in pyproject.toml), so the package metadata, ``petri
--version`` and ``petri.__version__`` cannot disagree. Not read back from the metadata at run
time: ``importlib.metadata`` costs more than ``petri --version`` itself."""
VERSION = "0.1.0"
