"""The wheel carries gpulab's notebooks/, params/ and patches/ inside the package (gpulab/_data/), so that an
installed gpulab runs its chain from the user's own folder; the top-level folders stay the only source
(gpulab.project reads a checkout first). Everything else is in pyproject.toml."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
DATA = ("notebooks", "params", "patches")


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):   # an editable install reads the checkout itself
            return
        dest = Path(self.build_lib) / "gpulab" / "_data"
        for name in DATA:
            if not (HERE / name).is_dir():
                raise SystemExit(f"setup.py: {HERE / name} is missing; build from a checkout or an sdist")
            shutil.copytree(HERE / name, dest / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))


setup(cmdclass={"build_py": BuildPyWithData})
