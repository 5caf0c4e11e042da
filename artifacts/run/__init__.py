"""What a run is and what is done with one: manifest, lock, validation, publish, KPR export, report, diff."""
