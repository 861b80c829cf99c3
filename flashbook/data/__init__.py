"""The recorded dataset: its schema (``schema``) and its reader (``results``), CPU only."""
