"""The optional packages fastattn.text reads tokenizers with: a clear ImportError without them."""
import importlib

_HINT = 'pip install "fastattn[text]"'


def require(module, why):
    """Import `module` (``sentencepiece``, ``tokenizers``) or raise ImportError saying `why` it
    is needed and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{why} needs the {module!r} package, which is not installed: "
                          f"{_HINT} (or pip install {module})") from exc


def optional(module):
    """`module` when installed, else None (tqdm for progress bars)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
