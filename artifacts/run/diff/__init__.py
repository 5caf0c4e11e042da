"""Comparing two runs of the pipeline (an older and a newer dump): what was added, removed or changed.

``keyed`` holds the set arithmetic over (key hash, row digest) arrays, ``rows`` streams each artifact into
those arrays, ``vectors`` measures how far the entity vectors of entities present in both runs moved, and
``runs`` puts the numbers together (``diff_runs``) for the ``diff`` command and the report.
"""
