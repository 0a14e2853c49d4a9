"""Protocol layer: records, wire codec, channel authentication, the dependency
frontier and the coordination policies.

Nothing in this package opens a socket, reads a clock or touches the kernel.
Policies are written against :class:`protocols.env.PolicyEnv`, which the node
process (``nodes/``) implements over real RPCs and an in-memory twin implements
for the pure tests. Imports run one way: ``testbed`` -> ``nodes`` -> ``protocols``.
"""
