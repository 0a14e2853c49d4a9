"""What the testbed does to this machine: kernel calls (``kernel``), the processes it
starts (``processes``), and the ledger that records and undoes every change
(``ledger``, ``testbed clean``)."""
