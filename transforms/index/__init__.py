"""index: reads a passage corpus (DPR's ``psgs_w100.tsv`` files, or ~100-word passages cut from ``articles/``; a KPR
encoder also reads ``dictionary/linker/`` and ``entity_embeddings/``; with ``--previous``, a previous run's
``index/``) and writes ``passages/`` and ``index/`` (sharded FAISS indexes). Its graph is in ``graph.py``
(``PreparePassages`` and, beside it, ``EncodePassages``, then ``BuildIndex``); the model's inputs built by every
core in ``inputs``, encoded by the processes that hold the model in ``forward``; reading the corpus in ``corpus``
(with ``line_ranges``, ``duplicate_ids``, ``passages``), what a previous run lends in ``refresh``; the encoders are in
``encoders.retrievers`` and ``encoders.kpr``, the FAISS files in ``artifacts.faiss``.
"""
