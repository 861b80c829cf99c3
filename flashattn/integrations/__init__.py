"""Adapters to other libraries' attention hooks. Each imports its library only when used:
flashattn itself does not depend on them (``flashattn.integrations.transformers.register()``)."""
