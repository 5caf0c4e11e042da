"""The Beam graph of every stage: one folder per command, in the order the pipeline runs, plus ``common``.

``parse`` -> ``dictionary`` -> ``mentions`` -> ``embed_entities`` -> ``index``; each folder's ``graph.py`` holds its
stage's config and the PTransform its ``pipelines/`` module runs, the other modules what that graph uses. A stage
folder imports ``common`` and its own modules, never another stage's folder (``tests/test_layering.py``).
"""
