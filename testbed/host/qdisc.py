"""Changing a qdisc's options often: a raw rtnetlink socket per namespace, and each
distinct message encoded once by pyroute2 and sent again as bytes.

The netem backend changes tbf's rate every 10 ms on every traced direction (AT&T: a
change at 46-81 % of the steps). Through ``IPRoute.tc`` one change costs about 0.5 ms
of Python here (encoding the message with its 256-entry rate table, an event-loop turn
per call) and several ms under an emulated CPU, where a two-agent replay alone kept a
vCPU busy and fell behind. The messages repeat (a trace has a few hundred distinct
rates), so each is encoded once.

Rules:

1. A message is exactly what ``IPRoute.tc("change", kind, index, handle=, parent=,
   **params)`` sends: RTM_NEWQDISC with NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE, the
   tcmsg fields, TCA_KIND and TCA_OPTIONS from pyroute2's own plugin for the kind
   (:func:`encode_change`, pure).
2. Every request waits for its acknowledgement; a refusal is a :class:`KernelError`
   with the kernel's errno.
3. A qdisc change does not wake a throttled qdisc: tbf sleeps until the timer it set at
   the old rate (a frame at tbf's 8 kbit/s "zero" rate: 1.5 s) even when the new rate
   would send its backlog at once. :meth:`QdiscChanges.kick` wakes the device's qdiscs
   by enqueueing a bare 14-byte Ethernet header (zero source and destination, the
   local experimental EtherType 0x88B5): any enqueue makes the root dequeue, and netem
   asks its child (tbf) on every dequeue. The frame costs 14 bytes of tokens, leaves
   after the link's delay and is dropped by whatever receives it (a bridge drops a
   zero source address; a host has no handler for the type).
4. Blocking, like :mod:`testbed.host.kernel`: call it through ``trio.to_thread``.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from testbed.host.kernel import KernelError, socket_in_netns

RTM_NEWQDISC = 36
NLMSG_ERROR = 2
CHANGE_FLAGS = 0x1 | 0x4 | 0x100  # NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE (pyroute2's "change")
_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_CACHE_MAX = 8192
KICK_FRAME = bytes(12) + b"\x88\xb5"


def encode_change(kind: str, index: int, *, handle: int, parent: int, **params: Any) -> bytes:
    """The rtnetlink message that changes qdisc HANDLE (under PARENT) on interface INDEX
    to PARAMS (pyroute2 keywords for KIND, e.g. tbf's rate, burst, limit); rule 1."""
    from pyroute2.netlink.rtnl.tcmsg import plugins, tcmsg

    plugin = plugins[kind]
    options = plugin.get_parameters(dict(params, kind=kind, index=index, handle=handle,
                                         parent=parent))
    msg = tcmsg()
    msg["index"] = index
    msg["handle"] = handle
    msg["parent"] = parent
    msg["attrs"] = [["TCA_KIND", kind], ["TCA_OPTIONS", options]]
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = CHANGE_FLAGS
    msg.encode()
    return bytes(msg.data)


class QdiscChanges:
    """Qdisc changes inside one namespace (None: this one) over one rtnetlink socket."""

    def __init__(self, netns: str | None) -> None:
        self._sock = socket_in_netns(netns, socket.AF_NETLINK, socket.SOCK_RAW)
        self._sock.bind((0, 0))
        self._netns = netns
        self._packet: socket.socket | None = None
        self._messages: dict[tuple[Any, ...], bytes] = {}
        self._seq = 0

    def change(self, kind: str, index: int, *, handle: int, parent: int, **params: Any) -> None:
        key = (kind, index, handle, parent, *sorted(params.items()))
        message = self._messages.get(key)
        if message is None:
            if len(self._messages) >= _CACHE_MAX:
                self._messages.clear()
            message = self._messages[key] = encode_change(kind, index, handle=handle,
                                                          parent=parent, **params)
        self._seq = self._seq % 0xFFFFFFFF + 1
        request = bytearray(message)
        struct.pack_into("=I", request, 8, self._seq)
        self._sock.send(request)
        while True:  # rule 2: the acknowledgement of this request
            reply = self._sock.recv(65536)
            _, kind_of_reply, _, seq, _ = _HEADER.unpack_from(reply)
            if seq == self._seq and kind_of_reply == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", reply, _HEADER.size)
                if code:
                    raise KernelError(-code, f"change {kind} {handle:#x} on ifindex {index}")
                return

    def kick(self, ifname: str) -> None:
        """Make IFNAME's qdiscs dequeue now (rule 3)."""
        if self._packet is None:
            self._packet = socket_in_netns(self._netns, socket.AF_PACKET, socket.SOCK_RAW)
        try:
            self._packet.sendto(KICK_FRAME, (ifname, 0))
        except OSError as exc:
            raise KernelError(exc.errno or 5, f"kick the qdiscs of {ifname}") from exc

    def close(self) -> None:
        self._sock.close()
        if self._packet is not None:
            self._packet.close()
