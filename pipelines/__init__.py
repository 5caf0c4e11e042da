"""The commands: one module per stage (``parse``, ``dictionary``, ``mentions``, ``embed_entities``, ``index``: flags
-> the stage's frozen config -> its graph from ``transforms/`` -> a staged commit) and per command on a run
(``search``, ``evaluate``, ``validate``, ``export_kpr``, ``publish``, ``report``, ``diff``, ``run_all``), with
``refresh`` for ``--previous``. The launcher's machinery is in ``launcher/``.
"""
