"""The human report of a run: OUT/report/index.html with PNG plots (see ``write_report``).

``gather`` reads the manifest and streams the artifacts into small aggregates, ``recall`` measures the index
against exact search, ``plots`` draws the PNGs and ``page`` writes the HTML; ``build`` ties them together.
(Nothing is imported here: the command line reads ``recall``'s defaults without pyarrow.)
"""
