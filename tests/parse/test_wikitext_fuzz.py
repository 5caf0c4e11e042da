"""Fuzzing the wikitext path: mutated real pages and generated markup never crash, hang or break offsets."""

from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.parse.dump_reader import RawPage, iter_pages
from transforms.parse.namespaces import Namespaces
from transforms.parse.wikitext import WikitextError, WikitextOptions, wikitext_to_text

ENGLISH = Namespaces.english_defaults()
TOKENS = ["[[", "]]", "{{", "}}", "{|", "|}", "|", "'''", "''", "<ref>", "</ref>", "<ref name=a/>", "<!--", "-->",
          "==", "\n", "*", ":", "#", "&amp;", "&nbsp;", "<nowiki>", "</nowiki>", "[http://x.org a]", "File:",
          "Category:", "fr:", "#sec", " ", "word", "Ünï", "{{{", "}}}", "<span>", "</span>", "<br/>", "<math>"]
SECONDS_PER_PAGE = 5.0


def check(wikitext: str, options: WikitextOptions) -> None:
    started = time.perf_counter()
    try:
        parsed = wikitext_to_text(wikitext, "Page", ENGLISH, options)
    except WikitextError:
        return
    finally:
        assert time.perf_counter() - started < SECONDS_PER_PAGE
    previous = 0
    for link in parsed.links:
        anchor = parsed.text[link.start:link.end]
        assert link.start >= previous and anchor and anchor == anchor.strip()
        previous = link.end


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60), st.booleans())
def test_generated_markup(tokens, use_prepass):
    check("".join(tokens), WikitextOptions(use_prepass=use_prepass, first_bold_as_link=True))


def mutate(text: str, rng: random.Random) -> str:
    """Cut, duplicate, delete or inject markup at random places."""
    for _ in range(rng.randint(1, 8)):
        position = rng.randrange(len(text) + 1)
        choice = rng.random()
        if choice < 0.3:
            text = text[:position] + rng.choice(TOKENS) + text[position:]
        elif choice < 0.6:
            text = text[:position] + text[position + rng.randint(1, 40):]
        elif choice < 0.8:
            text = text[:position] + text[position:position + rng.randint(1, 200)] * 2 + text[position:]
        else:
            text = text[:position]
    return text


def test_mutated_real_pages(single_stream_sample):
    rng = random.Random(1234)
    pages = [page.text for page in iter_pages(str(single_stream_sample))
             if isinstance(page, RawPage) and page.namespace == 0 and len(page.text) > 2000]
    for _ in range(400):
        page = rng.choice(pages)
        start = rng.randrange(len(page))
        snippet = page[start:start + rng.randint(200, 4000)]
        check(mutate(snippet, rng), WikitextOptions(use_prepass=rng.random() < 0.5))
