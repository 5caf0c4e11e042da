"""embed-entities: reads ``mentions/``, ``articles/`` and ``entities/`` (and with ``--previous`` a previous run's
``entity_embeddings/``), and writes ``entity_embeddings/``. Its graph is in ``graph.py`` (``PrepareMentions``,
``EncodeMentions``, ``ReduceEntities``); the windows cut from the articles in ``mention_windows``, the mention vectors
reduced per entity in ``entity_vectors``, what a previous run lends in ``refresh``; the model itself is
``encoders.mask_encoder``.
"""
