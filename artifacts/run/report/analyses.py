"""The report's per-stage analyses: entities and names (dictionary), entity embeddings, the index and its recall."""

from __future__ import annotations

import numpy as np

from artifacts.run.report.data import ReportData
from artifacts.run.report.markup import esc, kv, number, percent, plot, problem, size, table

MAX_CANDIDATES_SHOWN = 8
_ARROW_FLOATS = {"float": "float32", "halffloat": "float16", "double": "float64"}


def dictionary_extras(data: ReportData) -> str:
    return _entities_part(data) + _names_part(data)


def _entities_part(data: ReportData) -> str:
    stats = data.entities
    if stats is None:
        return "<h3>Entities</h3>" + problem(data, "entities")
    summary = kv([
        ("entities", number(stats.count)),
        ("with a Wikidata QID", f"{number(stats.with_qid)} ({percent(stats.with_qid / max(stats.count, 1))})"),
        ("inbound links", number(stats.total_links)),
        ("inbound links per entity", f"median {number(stats.quantile(0.5))} · 90th percentile "
                                     f"{number(stats.quantile(0.9))} · 99th percentile "
                                     f"{number(stats.quantile(0.99))} · "
                                     f"max {number(int(stats.link_count_values.max(initial=0)))}"),
        ("entities without inbound links", number(stats.without_links)),
    ])
    rows = [f'<tr><td class="num">{rank}</td><td>{esc(item.title)}</td><td class="num">{number(item.entity_id)}</td>'
            f'<td class="num">{number(item.link_count)}</td></tr>' for rank, item in enumerate(stats.top, 1)]
    top = table(["#", "entity", "entity_id", "inbound links"], rows, [True, False, True, True])
    return ("<h3>Entities: inbound link frequency</h3>" + summary
            + plot(data, "entity-links", "inbound links per entity, log-log") + "<h3>Most linked entities</h3>" + top)


def _names_part(data: ReportData) -> str:
    stats = data.dictionary
    if stats is None:
        return "<h3>Names</h3>" + problem(data, "dictionary")
    mean = stats.pairs / max(stats.names, 1)
    summary = kv([
        ("names", number(stats.names)),
        ("name-entity pairs", number(stats.pairs)),
        ("ambiguous names (2+ candidates)",
         f"{number(stats.ambiguous_names)} ({percent(stats.ambiguous_names / max(stats.names, 1))})"),
        ("candidates per name", f"mean {mean:.2f} · max {number(len(stats.candidates_per_name) - 1)}"),
    ])
    return ("<h3>Names: link probability and commonness</h3>" + summary
            + plot(data, "dictionary", "link probability, commonness and candidates per name")
            + '<p class="muted">Link probability is counted once per name; commonness once per name-entity pair. '
              "Log scale on the counts.</p>"
            + _ambiguous(stats.ambiguous))


def _ambiguous(names: list) -> str:
    if not names:
        return '<h3>Most ambiguous names</h3><p class="muted">No name has more than one candidate entity.</p>'
    rows = []
    for item in names:
        shown = item.candidates[:MAX_CANDIDATES_SHOWN]
        chips = "".join(
            f'<span class="cand" title="entity_id {item_candidate.entity_id}, {item_candidate.link_count:,} links">'
            f'{esc(item_candidate.title)} <span class="bar"><span style="width:{100 * item_candidate.commonness:.0f}%">'
            f'</span></span><span class="pct">{percent(item_candidate.commonness)}</span></span>'
            for item_candidate in shown)
        more = len(item.candidates) - len(shown)
        if more > 0:
            chips += f'<span class="muted">+{more} more</span>'
        rows.append(f'<tr><td class="amb-name">{esc(item.name)}</td><td class="num">{number(len(item.candidates))}</td>'
                    f'<td class="num">{number(item.total_link_count)}</td>'
                    f'<td class="num">{percent(item.link_prob)}</td><td>{chips}</td></tr>')
    return ('<h3>Most ambiguous names</h3><p class="muted">Names with the most candidate entities (ties: most links '
            "first); candidates by commonness.</p>"
            + table(["name", "candidates", "links", "link prob.", "candidate entities (commonness)"], rows,
                     [False, True, True, True], ' id="ambiguous-names"'))


def embedding_extras(data: ReportData) -> str:
    stats = data.embeddings
    if stats is None:
        return "<h3>Entity embeddings</h3>" + problem(data, "embeddings")
    meta = stats.metadata
    norms = stats.norms.astype(np.float64)
    spread = (f"min {norms.min():.6g} · mean {norms.mean():.6g} · max {norms.max():.6g} · "
              f"std {norms.std():.3g}") if len(norms) else "—"
    target = stats.target_norm
    deviation = f"{np.abs(norms - target).max() / target:.2e}" if target and len(norms) else "—"
    mentions = stats.mentions_per_entity
    total_mentions = int((np.arange(len(mentions)) * mentions).sum())
    summary = kv([
        ("entity vectors", number(stats.count)),
        ("dimension", number(stats.dim)),
        ("model", f"<code>{esc(meta.get('model', '?'))}</code> (layer {esc(meta.get('layer', '?'))}, "
                  f"computed in {esc(meta.get('dtype', '?'))})"),
        ("stored as", esc(meta.get("embedding_dtype") or _ARROW_FLOATS.get(stats.value_type, stats.value_type))),
        ("target norm (file metadata)", esc(meta.get("target_norm", "—"))),
        ("stored norms", esc(spread)),
        ("largest relative distance from the target", esc(deviation)),
        ("mentions averaged", f"{number(total_mentions)} (mean {total_mentions / max(stats.count, 1):.2f} per "
                              f"entity, max {number(len(mentions) - 1)})"),
    ])
    return ("<h3>Entity embeddings</h3>" + summary
            + plot(data, "entity-embeddings", "norm distribution and mentions per entity"))


def index_extras(data: ReportData) -> str:
    info = data.index_info
    if info is None:
        return "<h3>Index</h3>" + problem(data, "index")
    files = data.index_files
    used = [shard for shard in info.shard_files if shard.get("count")]
    encoder = info.encoder
    disk = (f"{esc(size(files.total))} in all: FAISS {esc(size(files.faiss))} · id maps {esc(size(files.id_maps))} · "
            f"stored vectors and texts {esc(size(files.embeddings))}") if files else "—"
    summary = kv([
        ("factory", f"<code>{esc(info.factory)}</code>"),
        ("metric", esc(info.metric)),
        ("dimension", number(info.dim)),
        ("shards", f"{number(info.shards)} ({number(len(used))} with passages)"),
        ("passages", number(info.count)),
        ("trained on", f"{number(info.train_sample)} vectors" if info.train_sample else "no training needed"),
        ("encoder", f"<code>{esc(encoder.get('model', '?'))}</code> ({esc(encoder.get('kind', '?'))}, "
                    f"{esc(encoder.get('dtype', '?'))})"),
        ("on disk", disk),
    ])
    return "<h3>Index</h3>" + summary + _recall(data)


def _recall(data: ReportData) -> str:
    result = data.recall
    if result is None:
        return "<h3>Recall</h3>" + (problem(data, "recall") or '<p class="muted">not measured</p>')
    if result.subset:
        how = (f"measured on a subset: exact search over the first {number(result.exact_vectors)} of "
               f"{number(result.total_vectors)} stored vectors (shard by shard, in file order; shards are hash "
               "partitions of the passage ids), the FAISS index restricted to the same passages with an ID selector")
    else:
        how = f"exact search over all {number(result.exact_vectors)} stored vectors"
    return (f"<h3>Recall</h3><p><span class=\"big\">{result.recall:.3f}</span> recall@{result.k} of the FAISS "
            f"index ({esc(result.search_settings)}) against exact {esc(data.index_info.metric)} search</p>"
            f'<p class="muted">{number(result.queries)} queries: stored passage vectors picked by a hash of their '
            f"ids; {esc(how)}; ties with the k-th exact score count as hits. Took {result.seconds:,.1f} s.</p>")


