"""Adapters to other libraries' attention hooks. Each imports its library only when used:
flashattn itself does not depend on them (``flashattn.integrations.transformers.register()``)."""

_SUBMODULES = ("transformers",)


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
