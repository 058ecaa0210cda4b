"""``tenantkv-admin``: the admin command line of tenantkv.

Installed as the package ``tenantkv_admin`` (a wheel installs no top-level
``admin``); in a checkout it is also importable as ``admin``, which is how the
tests and ``python -m admin.cli`` reach it.

:mod:`admin.cli` parses the command line and talks to the server through
:class:`tenantkv.Client`; :mod:`admin.format` renders results as aligned
tables or JSON. Both are importable: ``admin.cli.main(argv)`` returns the exit
status instead of exiting.
"""
