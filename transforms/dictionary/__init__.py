"""dictionary: reads ``articles/`` (twice: links, then text) and writes ``entities/``, ``dictionary/names/`` and
``dictionary/linker/``. Its graph is in ``graph.py`` (``BuildDictionary``); the first read in ``links``, the
per-bucket steps on the summed counts in ``candidates``, the second read in ``name_occurrences``, the element logic
on Arrow tables in ``tables`` (summed by bucket with ``arrow_combine``), the linker in ``linker``.
"""
