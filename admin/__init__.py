"""``tenantkv-admin``: the admin command line of tenantkv.

:mod:`admin.cli` parses the command line and talks to the server through
:class:`tenantkv.Client`; :mod:`admin.format` renders results as aligned
tables or JSON. Both are importable: ``admin.cli.main(argv)`` returns the exit
status instead of exiting.
"""
