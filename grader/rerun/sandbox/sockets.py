"""The memory a world's sockets hold in the kernel: what no process's Pss shows and a cgroup v1 does
not charge (its TCP, UDP, unix and netlink socket buffers).

Read as `ss -m` reads it, by sock_diag netlink dumps of the network namespace the caller is in
(the world's own, where the world has namespaces of its own), one per kind of socket:

    held = sum over the sockets of rmem_alloc + wmem_alloc + wmem_queued + backlog

(sk_meminfo: bytes received and not yet read, bytes sent and not yet freed, the send queue of a
stream, packets waiting for the socket's lock), in bytes of skb truesize. A unix socket's queue is
charged to its sender's wmem_alloc, a TCP or UDP socket's to its receiver's rmem_alloc, a netlink
socket's replies (the kernel's answers to requests nobody reads: about 1.6 MB a socket) to its
rmem_alloc: each byte
queued counts at least once; TCP's unacknowledged bytes may count twice (sent and received), which
errs toward the limit. Each socket's bytes come back by its inode, so that a world sharing the
machine's namespace counts only the sockets its processes hold (grader.rerun.sandbox.outside); in a
namespace of the world's own every socket counts, those only in flight inside a unix message
(SCM_RIGHTS: no process holds them) included. TCP is dumped only while the machine's TCP
sockets together hold TCP_DUMP_BYTES or more (`held`); below, that total counts instead.

These are the only sockets a rank may make (grader.rerun.rank.syscalls refuses every other family
and protocol: UDP-Lite, MPTCP, SCTP, vsock, netlink but for routes, ...). A dump the kernel refuses
(no sock_diag module for a kind) counts nothing for that kind, and `refused` says which: those
sockets are then bounded only by the ranks' open files and the machine's buffer sizes
(docs/security.md).
"""

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_SKMEMINFO = 7                     # the attribute (and idiag_ext bit 7 - 1) that asks for sk_meminfo
UNIX_DIAG_MEMINFO = 5
UDIAG_SHOW_MEMINFO = 0x20
NETLINK_DIAG_MEMINFO, NDIAG_SHOW_MEMINFO, NDIAG_PROTO_ALL = 0, 0x1, 255
ALL_STATES = 0xFFFFFFFF
# sk_meminfo's u32 fields: rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, optmem, backlog, drops
HELD = (0, 2, 5, 7)
# (family, protocol) of each dump: TCP and UDP over IPv4 and IPv6, unix and netlink sockets
KINDS = ((socket.AF_INET, socket.IPPROTO_TCP), (socket.AF_INET6, socket.IPPROTO_TCP),
         (socket.AF_INET, socket.IPPROTO_UDP), (socket.AF_INET6, socket.IPPROTO_UDP), (socket.AF_UNIX, 0),
         (socket.AF_NETLINK, NDIAG_PROTO_ALL))
INET_MSG = 72      # struct inet_diag_msg: family, state, timer, retrans, the 48-byte sockid, 5 u32 (inode last)
UNIX_MSG = 16      # struct unix_diag_msg: family, type, state, pad, ino, cookie[2]
NETLINK_MSG = 28   # struct netlink_diag_msg: family, type, protocol, state, portid, dst_portid, dst_group, ino, cookie[2]

PAGE = os.sysconf("SC_PAGE_SIZE")
TCP_DUMP_BYTES = 16 << 20   # below this, the machine's TCP memory as a whole stands in for a dump
PCPU_RESERVE = 1 << 20      # what each CPU may hold of a protocol's memory before the total sees it

refused = set()    # the kinds whose dump the kernel refused, by name ("udp6")


def _request(family: int, protocol: int) -> bytes:
    if family == socket.AF_UNIX:   # struct unix_diag_req
        body = struct.pack("=BBHIIIII", family, 0, 0, ALL_STATES, 0, UDIAG_SHOW_MEMINFO, 0, 0)
    elif family == socket.AF_NETLINK:   # struct netlink_diag_req: every protocol, any inode
        body = struct.pack("=BBHIIII", family, protocol, 0, 0, NDIAG_SHOW_MEMINFO, 0, 0)
    else:                          # struct inet_diag_req_v2, the sockid left zero (any)
        body = struct.pack("=BBBxI", family, protocol, 1 << (INET_DIAG_SKMEMINFO - 1), ALL_STATES) + bytes(48)
    return struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body


def _attributes(data: bytes, offset: int, end: int):
    """(type, payload) of each netlink attribute in data[offset:end]."""
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4:
            return
        yield kind & 0x3FFF, data[offset + 4:offset + length]
        offset += (length + 3) & ~3


def _message_held(family: int, data: bytes, start: int, end: int) -> tuple:
    """(inode, bytes it holds) of one socket's reply."""
    if family == socket.AF_UNIX:
        head, inode, wanted = UNIX_MSG, struct.unpack_from("=I", data, start + 4)[0], UNIX_DIAG_MEMINFO
    elif family == socket.AF_NETLINK:
        head, inode, wanted = NETLINK_MSG, struct.unpack_from("=I", data, start + 16)[0], NETLINK_DIAG_MEMINFO
    else:
        head, inode, wanted = INET_MSG, struct.unpack_from("=I", data, start + INET_MSG - 4)[0], INET_DIAG_SKMEMINFO
    for kind, payload in _attributes(data, start + head, end):
        if kind == wanted and len(payload) >= 4 * (max(HELD) + 1):
            fields = struct.unpack_from(f"={max(HELD) + 1}I", payload)
            return inode, sum(fields[i] for i in HELD)
    return inode, 0


def _dump(family: int, protocol: int, found: dict) -> None:
    """Add what the sockets of one kind hold to `found` (inode -> bytes), by one dump."""
    name = {socket.AF_UNIX: "unix", socket.AF_NETLINK: "netlink"}.get(family) or ("tcp" if protocol == socket.IPPROTO_TCP else "udp") + (
        "6" if family == socket.AF_INET6 else "")
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendall(_request(family, protocol))
        while True:
            data = nl.recv(1 << 16)
            if not data:
                return
            offset = 0
            while offset + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, offset)
                if kind == NLMSG_ERROR:
                    refused.add(name)
                if length < 16 or kind in (NLMSG_DONE, NLMSG_ERROR):
                    return
                inode, size = _message_held(family, data, offset + 16, offset + length)
                if size:
                    found[inode] = found.get(inode, 0) + size
                offset += (length + 3) & ~3


def _pool(*kinds: str) -> int:
    """What every socket of `kinds` ("TCP:", "UDP:") of the machine holds together (sockstat's
    "mem" pages, IPv4 and IPv6 alike), in bytes; -1 where it cannot be read."""
    total = -1
    try:
        with open("/proc/net/sockstat") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] in kinds and "mem" in fields:
                    total = max(total, 0) + int(fields[fields.index("mem") + 1]) * PAGE
    except (OSError, ValueError, IndexError):
        return -1
    return total


def _tcp_memory() -> int:
    """What every TCP socket of the machine holds together, in bytes; -1 where it cannot be read."""
    return _pool("TCP:")


def pool() -> int:
    """What the machine's TCP and UDP sockets hold together, in bytes (one file read: cheap enough
    for every poll of a watchdog); -1 where it cannot be read."""
    return _pool("TCP:", "UDP:")


def held() -> dict:
    """{socket inode: bytes it holds in the kernel} for the sockets of this network namespace that
    hold any; see the module docstring. A TCP dump walks the machine's whole connection table (a
    few ms): while all of the machine's TCP sockets hold less than TCP_DUMP_BYTES together, that
    total stands in for this namespace's, under inode 0."""
    found = {}
    tcp = _tcp_memory()
    for family, protocol in KINDS:
        if protocol == socket.IPPROTO_TCP and 0 <= tcp < TCP_DUMP_BYTES:
            found[0] = tcp + (os.cpu_count() or 1) * PCPU_RESERVE   # what the CPUs hold back from the total
            continue
        try:
            _dump(family, protocol, found)
        except OSError:
            refused.add(f"{family}/{protocol}")
    return found


def inode(link: str) -> int:
    """The inode number of a "socket:[12345]" fd link; 0 for anything else."""
    return int(link[8:-1]) if link.startswith("socket:[") and link[8:-1].isdigit() else 0

