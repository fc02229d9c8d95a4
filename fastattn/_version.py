# The one place the version lives: setup.py, the wheel name and fastattn.__version__ read it.
__version__ = "0.1.0"
