"""The simulation backend: campaign episodes in virtual time (``--backend sim``).

Layers, each one module, each importing only those above it:

- ``kernel``: the deterministic event loop (integer nanoseconds, a heap, no wall clock)
  and the coroutine tasks the protocol code runs in;
- ``network``: every host's access link, one :class:`testbed.links.model.LinkQueue` per
  direction (the userspace emulator's own model), packets routed up then down;
- ``tcp``: connections over it (handshake segments, MSS segmentation, cumulative ACKs,
  a congestion window, retransmission on timeout);
- ``frames``: the exact frame bytes of the data plane (the transport's own encoding);
- ``calibration``: the nodes' service times, measured on this host's real nodes;
- ``store``, ``node``: a node's store and its control ops over the unchanged protocol
  code (``protocols/``) and the node's own handlers (``nodes.rpc``);
- ``episode``: the campaign loop's Runner for the sim backend.
"""
