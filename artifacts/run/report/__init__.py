"""The human report of a run: OUT/report/index.html with PNG plots (see ``write_report``).

``gather`` reads the manifest and streams the artifacts into small aggregates, ``recall`` measures the index
against exact search, ``plots`` draws the PNGs and ``page`` writes the HTML; ``build`` ties them together.
"""

from artifacts.run.report.build import write_report

__all__ = ["write_report"]
