"""journalq: a durable message queue that lives in a directory.

The bottom layer, :mod:`journalq.journal`, reads and writes the segmented journal format of
h12.io/sej byte for byte. Every exception journalq raises subclasses :class:`journalq.Error`.
"""

from journalq.errors import Error

__all__ = ["Error", "__version__"]
__version__ = "0.1.0"
