"""Where a world's ranks meet to join gloo: a TCP store that rank 0 serves on a socket its leader
opened, or, under torchrun, a file store in the world's folder.

gloo's rendezvous is a few rounds of keys: each rank sets its address and waits for every other
rank's. torch's FileStore waits for a key by reading its file again every 10 ms, so each round
costs up to that much sleep: about 7 ms a world of four ranks, in which nothing runs. A TCPStore
answers a waiting rank the moment the key is set.

The leader opens the listening socket (`listen`) on the loopback of the world's own network
namespace before it forks the ranks: rank 0 serves the store on it (`FD`, the descriptor it gets
it as), and every other rank connects to its port, which the kernel accepts into the socket's
backlog even before rank 0 serves it. No port is chosen by a rank, so no two worlds of one machine
(`--sandbox off`, `--jobs N`) can take the same one. The store is the world's, as its file was: the
hand-in may use it (torch.distributed does, for a group of its own), and what it does to it is its
own world's.
"""

import datetime
import socket

FD = 5   # rank 0's listening socket; the result pipe is fd 3, the data pipe fd 4


def listen(world_size: int) -> socket.socket:
    """A socket listening on the loopback, on a port the kernel picked, with room for every rank's
    connections to the store (each rank opens one, its process group another)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(4 * world_size)
    return server


def join(rank: int, world_size: int, port: int, path: str, timeout_s: float):
    """This rank's store: rank 0 serves it on `FD` and the others connect to `port`, or, where
    there is no port (torchrun's ranks), the file store at `path`."""
    import torch.distributed as dist   # here: the leader's module (grader.rerun.world) imports this one, and the grader that one
    if not port:
        return dist.FileStore(path, world_size)
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        return dist.TCPStore("127.0.0.1", port, world_size, True, timeout, wait_for_workers=False,
                             master_listen_fd=FD)
    return dist.TCPStore("127.0.0.1", port, world_size, False, timeout)
