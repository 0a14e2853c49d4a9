"""Links: capacity traces (``traces``), network profiles (``profiles``), the pure link
model (``model``), and the link backends behind one interface (``backend``,
``backends``): ``userspace`` (TUN devices + the ``emulator`` process) and ``netem``
(kernel qdiscs, planned by ``netem_plan``)."""
