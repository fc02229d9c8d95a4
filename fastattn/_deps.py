"""Optional packages (the extras): a clear ImportError naming the extra without them."""
import importlib


def require(module, why, extra="text"):
    """Import `module` (``sentencepiece``, ``tokenizers`` of the text extra; ``soundfile``,
    ``av`` of the audio extra) or raise ImportError saying `why` it is needed and how to
    install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{why} needs the {module!r} package, which is not installed: "
                          f'pip install "fastattn[{extra}]" (or pip install {module})') from exc


def optional(module):
    """`module` when installed, else None (tqdm for progress bars)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
