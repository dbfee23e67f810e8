"""The live view of a capture being written (``pyobmem live FILE``, ``pyobmem-run --live``).

Modules: tail (reads a growing capture: the header once, then only the records appended since
the last read), figures (what the screen shows, computed by the model's queries on the records
read so far), view (the terminal screen, drawn with rich, and its keys). docs/internals.md, "The
live view", says how they fit.
"""
