"""The campaign's network: a pure plan of hosts (``plan``), and the topology built from it
(``topology``: namespaces + a link backend), torn down on exit or SIGTERM (``signals``)."""
