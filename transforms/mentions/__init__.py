"""mentions: reads ``articles/`` (links, then the sampled articles again) and ``entities/``, and writes
``mentions/``: for every entity a deterministic bottom-k sample of the links to it, as references into the
articles. Its graph is in ``graph.py`` (``SampleMentions``); the sample and window rule it shares with
embed-entities is ``transforms.common.mention_sampling``.
"""
