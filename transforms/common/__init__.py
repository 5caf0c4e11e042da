"""What several stages share: counting and dead letters (``dead_letters``), aggregations spilled by bucket
(``spill``), packed arrays keyed by buckets of ids (``packed``), Parquet rows read by row range (``parquet_rows``),
progress lines (``progress``), objects built once per worker process (``per_worker``) from files a stage writes for
its workers (``worker_files``), and the lookups the mentions and embed-entities stages both use: where each article
lies (``article_shards``), the entities' title map (``entity_maps``) and the mention sample and window rule
(``mention_sampling``); two pipelines run side by side, the second following the files the first writes
(``follow``: the model's inputs of embed-entities and index). Nothing here imports a stage's folder.
"""
