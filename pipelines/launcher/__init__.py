"""The launcher's machinery, shared by every command: the command line (``cli``, ``commands``, ``flags``), how a
stage runs and commits (``stage``), the runner and its workers (``runners``, ``local_workers``, ``environment``),
what reaches the terminal (``console``, ``worker_output``), Ctrl-C (``interrupt``) and a full disk
(``disk_space``).
"""
