"""parse: reads the dump files (XML, bz2 single or multistream, gzip; optional SQL tables for redirects, pages and
QIDs) and writes ``articles/`` (text with resolved links) and ``redirects/``. Its graph is in ``graph.py``
(``ConvertPages``, then ``ResolveStagedArticles``); reading dumps in ``dump_io``, ``dump_reader``, ``multistream``
and ``sql_dump``; wikitext to text in ``wikitext`` (with ``wikitext_prepass``, ``wikitext_quotes``, ``titles``,
``namespaces``); the title map and its use in ``redirects`` and ``link_resolution``.
"""
