"""The namespaces of one wiki, as its dump's <siteinfo> declares them (so other languages work)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property

from transforms.parse.titles import normalize_title

ARTICLE = 0
FILE = 6
CATEGORY = 14
MEDIA = -2

# MediaWiki's canonical names, which every Wikipedia accepts beside the local names its <siteinfo> lists (Module:
# Scribunto's, on every Wikimedia wiki) ...
_EVERY_WIKI = {
    "media": MEDIA, "special": -1, "talk": 1, "user": 2, "user talk": 3, "project": 4, "project talk": 5,
    "wikipedia": 4, "wikipedia talk": 5,
    "file": FILE, "image": FILE, "file talk": 7, "image talk": 7, "mediawiki": 8, "mediawiki talk": 9,
    "template": 10, "template talk": 11, "help": 12, "help talk": 13, "category": CATEGORY,
    "category talk": 15, "module": 828, "module talk": 829,
}
# ... and those of English Wikipedia's own (a wiki's extra namespaces: on one that does not list them, "Draft:Bar"
# is an article's title), for a dump without <siteinfo>.
_ENGLISH_DEFAULTS = {**_EVERY_WIKI, "portal": 100, "portal talk": 101, "draft": 118, "draft talk": 119}

# Aliases that wikis accept but <siteinfo> does not list (it lists no aliases), by language code: old local names
# of the File namespace, the Chinese names of File, Category and Media (MessagesZh_hans.php, MessagesZh_hant.php),
# Japanese Wikipedia's カテゴリ, and English Wikipedia's WP: and WT: (``[[WP:NPOV]]``).
_UNLISTED_ALIASES: dict[str, dict[str, int]] = {
    "en": {"WP": 4, "WT": 5}, "it": {"Immagine": FILE}, "de": {"Bild": FILE}, "fr": {"Image": FILE},
    "es": {"Imagen": FILE}, "pt": {"Imagem": FILE, "Arquivo": FILE}, "nl": {"Afbeelding": FILE},
    "pl": {"Grafika": FILE}, "ru": {"Изображение": FILE}, "sv": {"Bild": FILE}, "tr": {"Resim": FILE},
    "ja": {"画像": FILE, "カテゴリ": CATEGORY},
    "zh": {"文件": FILE, "档案": FILE, "檔案": FILE, "图像": FILE, "圖像": FILE, "图片": FILE, "分类": CATEGORY,
           "分類": CATEGORY, "媒体": MEDIA},
}

# The other interwiki prefixes of the Wikipedias whose code is not their language's (Wikimedia's interwiki map)
_OTHER_CODES = {"zh-yue": ("yue",), "zh-min-nan": ("nan",), "zh-classical": ("lzh",), "be-x-old": ("be-tarask",),
                "roa-rup": ("rup",), "bat-smg": ("sgs",), "fiu-vro": ("vro",), "no": ("nb",)}

# The letters after a link's "]]" that join its anchor ("[[lichen]]s"): MediaWiki's $linkTrail of the wiki's
# language (languages/messages/Messages*.php, as a regex character class), by Wikipedia language code; English's for
# the others. Chinese's is empty: no letter joins a link there.
ENGLISH_TRAIL_LETTERS = "a-z"
_TRAIL_LETTERS = {
    "it": "a-zàéèíîìóòúù", "de": "äöüßa-z", "fr": "a-zàâçéèêîôûäëïöüùÇÉÂÊÎÔÛÄËÏÖÜÀÈÙ", "es": "a-záéíóúñ",
    "pt": "áâãàéêẽçíòóôõq̃úüűũa-z", "nl": "a-zäöüïëéèà", "pl": "a-zęóąśłżźćńĘÓĄŚŁŻŹĆŃ",
    "ru": "a-zабвгдеёжзийклмнопрстуфхцчшщъыьэюя", "bg": "a-zабвгдежзийклмнопрстуфхцчшщъыьэюя",
    "uk": "a-zабвгґдеєжзиіїйклмнопрстуфхцчшщьєюяёъы“»", "sv": "a-zåäöéÅÄÖÉ", "no": "æøåa-z", "da": "a-zæøå",
    "fi": "a-zäö", "cs": "a-záčďéěíňóřšťúůýž", "hu": "a-záéíóúöüőűÁÉÍÓÚÖÜŐŰ", "ro": "a-zăâîşţșțĂÂÎŞŢȘȚ",
    "tr": "a-zÇĞçğİıÖöŞşÜüÂâÎîÛû", "he": "a-zא-ת", "fa": "ابپتثجچحخدذرزژسشصضطظعغفقکگلمنوهیآأئؤة",
    "vi": "a-zàâçéèêîôûäëïöüùÇÉÂÊÎÔÛÄËÏÖÜÀÈÙ", "zh": "",
}
# Languages whose titles' first "i" is upper-cased to "İ" (MediaWiki's LanguageTr, LanguageAz and LanguageKaa).
_DOTTED_I_LANGUAGES = frozenset({"tr", "az", "kaa"})


def trail_class(letters: str) -> str:
    """A regex matching one letter of a link trail made of ``letters`` (a character class), or none if empty."""
    return f"[{letters}]" if letters else r"[^\s\S]"


def unlisted_aliases(language: str | None) -> dict[str, int]:
    """The namespace aliases a wiki accepts but does not list, by its language code (``it``: {"Immagine": 6})."""
    return dict(_UNLISTED_ALIASES.get(language or "", {}))


def self_interwiki_prefixes(language: str | None) -> frozenset[str]:
    """Interwiki prefixes of a Wikipedia that link to itself: its language code (``it:``) and the other codes of
    that language in Wikimedia's interwiki map (``yue:`` of ``zh-yue:``), and for English the map's ``w:`` (which
    targets en.wikipedia; ``wikipedia:`` is the Project namespace there)."""
    if not language:
        return frozenset()
    return frozenset({language, *_OTHER_CODES.get(language, ()), *(("w",) if language == "en" else ())})


@dataclass(frozen=True)
class Namespaces:
    """Namespace ids by lower-cased local name (and aliases), e.g. {"file": 6, "immagine": 6, ...}, and the
    interwiki prefixes that point back to this same wiki (``[[:en:God|Godt]]`` on the English Wikipedia)."""

    by_name: dict[str, int] = field(default_factory=dict)
    self_prefixes: frozenset[str] = frozenset()
    trail_letters: str = ENGLISH_TRAIL_LETTERS  # a regex character class: the letters of a link trail
    dotted_i: bool = False  # a link's first "i" is upper-cased to "İ" (``titles.first_upper``)
    # MediaWiki's "first-letter" case of article titles; False on a "case-sensitive" wiki (Wiktionary, jbo.wikipedia)
    first_letter: bool = True

    @cached_property
    def link_trail(self) -> re.Pattern[str]:
        """The letters that start a text and join the link before it as its trail (none where there are none)."""
        return re.compile(trail_class(self.trail_letters) + "+")

    @classmethod
    def english_defaults(cls) -> Namespaces:
        return cls(dict(_ENGLISH_DEFAULTS), self_interwiki_prefixes("en"))

    @classmethod
    def canonical(cls) -> Namespaces:
        """The names every wiki accepts, to which its <siteinfo> adds its own."""
        return cls(dict(_EVERY_WIKI), self_interwiki_prefixes("en"))

    def points_here(self, prefix: str) -> bool:
        """True if an interwiki prefix such as ``en`` or `` W `` links to this wiki itself."""
        return prefix.strip().lower() in self.self_prefixes

    def lookup(self, prefix: str) -> int | None:
        """The namespace id of a link prefix such as ``Category`` or `` file `` (None if not a namespace)."""
        return self.by_name.get(" ".join(prefix.replace("_", " ").split()).lower())

    def title(self, raw: str) -> str:
        """A page's or link's title (``titles.normalize_title``) by this wiki's case rule."""
        return normalize_title(raw, self.dotted_i, self.first_letter)

    def with_names(self, names: dict[str, int]) -> Namespaces:
        return replace(self, by_name={**self.by_name, **{key.lower(): value for key, value in names.items()}})

    def with_language(self, language: str | None) -> Namespaces:
        """These namespaces for a Wikipedia of ``language``: its own interwiki prefixes point here, its letters
        make link trails, its case rule makes titles."""
        return replace(self, self_prefixes=self_interwiki_prefixes(language),
                       trail_letters=_TRAIL_LETTERS.get(language or "", ENGLISH_TRAIL_LETTERS),
                       dotted_i=language in _DOTTED_I_LANGUAGES)
