#!/usr/bin/env python3
"""Two machines and a server on a network of their own: scripts/partition-test.sh runs this.

    partition.py DOCFS [WORK]

Makes three network namespaces: a server host running PostgreSQL, and hosts A and B, each
joined to the server by a veth pair of its own (A: 10.231.1.2 to 10.231.1.1; B: 10.231.2.2 to
10.231.2.1). A `docfs mount` daemon runs on each of A and B (`nsenter --net`: the daemon is on
its host's network and its mount is in this machine's file system tree), so that every packet
between the mounts and the server crosses those links and none reaches this machine's own
network. A partition is nftables dropping everything on A's side, in both directions, as a cut
cable or a dead switch port would: no reset, no error, only silence.

The cases, each on files of its own:
  partition   A holds a flock and is cut off: B gets the lock once A's lease ends; A's holder
              then gets EIO; after healing, A reads B's change and locks again.
  heal        A writes a document while cut off (not acknowledged: its fsync fails) and B
              writes and fsyncs the same one: after healing, B's acknowledged text is the
              document and A's is kept beside it as a conflict version; an fsync acknowledged
              on A before the cut is in the store.
  kill        SIGKILL of A's daemon while it holds a lock: B gets it within the lease; A
              mounts again.
  restart     the server restarts while A holds a lock: never do A's holder and B both have
              it; what was acknowledged before is there, and both mounts save and see each
              other's changes after it.

Prints one line per check and exits non-zero when any failed. Needs root, ip, nsenter, nft
and PostgreSQL 15's server programs.
"""
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PG_BIN = "/usr/lib/postgresql/15/bin"
SERVER_A, HOST_A = "10.231.1.1", "10.231.1.2"
SERVER_B, HOST_B = "10.231.2.1", "10.231.2.2"
PORT = 5432
# The mount's lock lease (FileLocks.lease): a lock whose holder stopped renewing is free after it.
LEASE = 6.0

failures = []


def check(condition, what, detail=""):
    print(("ok    " if condition else "FAIL  ") + what + (f": {detail}" if detail and not condition else ""))
    if not condition:
        failures.append(what)
    sys.stdout.flush()
    return condition


def run(args, timeout=60, check_status=True, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check_status and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited with {result.returncode}: {result.stderr.strip()}")
    return result


def wait_until(condition, limit, step=0.05):
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if condition():
            return time.monotonic() - start
        time.sleep(step)
    return None


class Network:
    """The three hosts and their links; `cut` and `heal` drop and pass A's traffic."""

    def __init__(self, tag):
        self.server, self.a, self.b = f"dfs{tag}s", f"dfs{tag}a", f"dfs{tag}b"
        self.made = []
        self.links = {}  # host: the server's end of its link
        for name in (self.server, self.a, self.b):
            run(["ip", "netns", "add", name])
            self.made.append(name)
            run(["ip", "-n", name, "link", "set", "lo", "up"])
        for host, server_address, host_address, side in (
            (self.a, SERVER_A, HOST_A, "a"),
            (self.b, SERVER_B, HOST_B, "b"),
        ):
            outer, inner = f"dfs{tag}{side}0", f"dfs{tag}{side}1"
            self.links[host] = outer
            run(["ip", "link", "add", outer, "netns", self.server, "type", "veth", "peer", "name", inner, "netns", host])
            run(["ip", "-n", self.server, "addr", "add", f"{server_address}/24", "dev", outer])
            run(["ip", "-n", host, "addr", "add", f"{host_address}/24", "dev", inner])
            run(["ip", "-n", self.server, "link", "set", outer, "up"])
            run(["ip", "-n", host, "link", "set", inner, "up"])

    def enter(self, host):
        return ["nsenter", f"--net=/run/netns/{host}"]

    def cut(self, host):
        """Drops every packet that arrives on either end of the host's link. Only arriving ones:
        a packet the output hook drops fails its sender with EPERM at once, which no cut cable
        does; these are sent, and never heard of again."""
        link = self.links[host]
        run(["ip", "netns", "exec", host, "nft", "-f", "-"],
            input="table inet docfs_cut {\n chain input {\n  type filter hook input priority 0; policy drop;\n }\n}\n")
        run(["ip", "netns", "exec", self.server, "nft", "-f", "-"],
            input="table inet docfs_cut {\n chain input {\n  type filter hook input priority 0;\n"
                  f'  iifname "{link}" drop\n }}\n}}\n')

    def heal(self, host):
        run(["ip", "netns", "exec", host, "nft", "delete", "table", "inet", "docfs_cut"])
        run(["ip", "netns", "exec", self.server, "nft", "delete", "table", "inet", "docfs_cut"])

    def remove(self):
        for name in self.made:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


class Server:
    """PostgreSQL 15 on the server host, listening on its two links only."""

    def __init__(self, network, folder):
        self.network, self.folder = network, folder
        self.data = os.path.join(folder, "data")
        self.process = None
        os.makedirs(folder)
        shutil.chown(folder, "postgres", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        run(as_postgres + [f"{PG_BIN}/initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
        with open(os.path.join(self.data, "pg_hba.conf"), "a") as hba:
            hba.write("host all all 10.231.0.0/16 trust\n")
        self.start()

    def start(self):
        pw = __import__("pwd").getpwnam("postgres")
        log = open(os.path.join(self.folder, "server.log"), "a")
        self.process = subprocess.Popen(
            self.network.enter(self.network.server)
            + [f"--setuid={pw.pw_uid}", f"--setgid={pw.pw_gid}", f"{PG_BIN}/postgres", "-D", self.data,
               "-p", str(PORT), "-k", self.folder, "-c", f"listen_addresses={SERVER_A},{SERVER_B}",
               "-c", "max_connections=100", "-c", "shared_buffers=32MB"],
            stdout=log, stderr=log)
        ready = wait_until(lambda: self.ready(), 60, step=0.1)
        if ready is None:
            raise RuntimeError("PostgreSQL did not start; see " + log.name)

    def ready(self):
        result = subprocess.run(
            self.network.enter(self.network.server) + [f"{PG_BIN}/pg_isready", "-q", "-h", SERVER_A, "-p", str(PORT)],
            capture_output=True)
        return result.returncode == 0

    def stop(self):
        """A fast shutdown (SIGINT): sessions are ended, as in a restart for an upgrade."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=60)
        self.process = None

    def psql(self, sql):
        return run(self.network.enter(self.network.server)
                   + ["psql", "-h", SERVER_A, "-p", str(PORT), "-U", "postgres", "-Atc", sql])


class Mount:
    """A `docfs mount -f` daemon on a host, its mount point in this machine's tree."""

    def __init__(self, docfs, network, host, url, path, log):
        self.docfs, self.network, self.host, self.url, self.path, self.log = docfs, network, host, url, path, log
        os.makedirs(path, exist_ok=True)
        self.start()

    def start(self):
        log = open(self.log, "a")
        self.process = subprocess.Popen(
            self.network.enter(self.host) + [self.docfs, "mount", "-f", self.url, self.path], stdout=log, stderr=log)
        if wait_until(lambda: self.mounted(), 30) is None:
            raise RuntimeError(f"the mount at {self.path} never came up; see {self.log}")

    def mounted(self):
        with open("/proc/self/mounts") as mounts:
            return any(line.split()[1] == self.path for line in mounts)

    def kill(self):
        self.process.kill()
        self.process.wait(timeout=30)
        subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)

    def unmount(self):
        result = subprocess.run(["fusermount3", "-u", self.path], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return None

    def file(self, name):
        return os.path.join(self.path, name)


ACTOR = r"""
import errno, fcntl, json, os, sys, time
fds = {}
for line in sys.stdin:
    request = json.loads(line)
    op, args = request["op"], request.get("args", [])
    start = time.monotonic()
    answer = {}
    try:
        if op == "open":
            fd = os.open(args[0], args[1], 0o644)
            fds[fd] = True
            answer["value"] = fd
        elif op == "flock":
            fcntl.flock(args[0], (fcntl.LOCK_EX if args[1] else fcntl.LOCK_SH) | (fcntl.LOCK_NB if args[2] else 0))
        elif op == "unlock":
            fcntl.flock(args[0], fcntl.LOCK_UN)
        elif op == "replace":
            os.ftruncate(args[0], 0)
            os.pwrite(args[0], args[1].encode(), 0)
        elif op == "write":
            os.pwrite(args[0], args[1].encode(), 0)
        elif op == "read":
            answer["value"] = os.pread(args[0], 1 << 16, 0).decode(errors="replace")
        elif op == "fsync":
            os.fsync(args[0])
        elif op == "close":
            fds.pop(args[0], None)
            os.close(args[0])
        answer["ok"] = True
    except OSError as error:
        answer["ok"] = False
        answer["errno"] = errno.errorcode.get(error.errno, str(error.errno))
    answer["seconds"] = time.monotonic() - start
    print(json.dumps(answer), flush=True)
"""


class Actor:
    """A process that keeps descriptors open and runs one file call per request."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", ACTOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self, op, *args, timeout=40):
        self.process.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            return {"ok": False, "errno": "TIMEOUT", "seconds": timeout}
        return json.loads(self.process.stdout.readline())

    def end(self):
        self.process.kill()
        self.process.wait()


def text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as error:
        return f"<{errno.errorcode.get(error.errno, error.errno)}>"


def write_synced(path, content):
    with open(path, "w") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())


def flock_command(path, wait, body="true"):
    """`flock(1)` on `path` from this machine: (exit status, seconds, output)."""
    start = time.monotonic()
    result = subprocess.run(["flock", "-w", str(wait), "-x", path, "sh", "-c", body], capture_output=True,
                            text=True, timeout=wait + 30)
    return result.returncode, time.monotonic() - start, result.stdout


def partition_case(network, a, b):
    print("-- a partition while A holds a lock")
    name = "Shared.pkg/partition.txt"
    holder = Actor()
    try:
        fd = holder("open", a.file(name), os.O_RDWR)["value"]
        check(holder("flock", fd, True, False)["ok"], "A takes the lock")
        holder("replace", fd, "A1\n")
        check(holder("fsync", fd)["ok"], "A's write under the lock is acknowledged")
        status, _, _ = flock_command(b.file(name), 0)
        check(status == 1, "B cannot take the lock A holds", f"flock exited {status}")
        network.cut(network.a)
        cut = time.monotonic()
        status, seconds, seen = flock_command(b.file(name), 30, f"cat '{b.file(name)}'; printf 'B1\\n' > '{b.file(name)}'")
        since = time.monotonic() - cut
        check(status == 0, "B gets the lock once A's lease ends", f"flock exited {status}")
        check(LEASE - 2.5 < since < LEASE + 5, f"B's lock came {since:.1f} s after the cut (lease {LEASE:.0f} s)")
        check(seen == "A1\n", "B reads what A wrote under the lock", repr(seen))
        print(f"info  B waited {seconds:.1f} s for the lock")
        # A's daemon counted its lease as lost before the store could grant it to B, so the
        # holder's I/O fails at once (not after a request to the unreachable server timed out).
        for op, args in (("read", ()), ("write", ("A2\n",)), ("fsync", ())):
            answer = holder(op, fd, *args)
            check(not answer["ok"] and answer["errno"] == "EIO" and answer["seconds"] < 1,
                  f"A's holder: {op} answers EIO at once after its lease ended", str(answer))
        holder("close", fd)
        network.heal(network.a)
        fresh = wait_until(lambda: text(a.file(name)) == "B1\n", 20)
        check(fresh is not None, "after healing, A reads B's change", text(a.file(name)))
        status, seconds, _ = flock_command(a.file(name), 20)
        check(status == 0 and seconds < 5, f"after healing, A locks again ({seconds:.1f} s)", f"flock exited {status}")
    finally:
        holder.end()


def heal_case(network, a, b):
    print("-- writes on both sides of a partition, then healing")
    name = "Heal.txt"
    kept = "Shared.pkg/acknowledged.txt"
    write_synced(a.file(name), "base\n")
    write_synced(a.file(kept), "acknowledged before the cut\n")
    check(wait_until(lambda: text(b.file(name)) == "base\n", 20) is not None, "B sees A's document")
    network.cut(network.a)
    offline = Actor()
    try:
        fd = offline("open", a.file(name), os.O_RDWR)["value"]
        wrote = offline("replace", fd, "from A, offline\n")
        synced = offline("fsync", fd)
        check(not synced["ok"], "A's fsync without the server is not acknowledged", str(synced))
        print(f"info  A offline: write {wrote}, fsync {synced}")
        offline("close", fd)
    finally:
        offline.end()
    write_synced(b.file(name), "from B\n")
    check(True, "B's write and fsync while A is cut off are acknowledged")
    network.heal(network.a)
    # A's pending change is saved once the server answers again: a conflict, as its base is old.
    listing = lambda: [entry for entry in os.listdir(b.path) if entry.startswith("Heal (conflict")]
    waited = wait_until(lambda: listing() != [], 40, step=0.2)
    check(waited is not None, "after healing, A's change reaches the store as a conflict version",
          str(os.listdir(b.path)))
    if waited is not None:
        print(f"info  the conflict version appeared {waited:.1f} s after healing")
        conflict = listing()[0]
        check(text(b.file(conflict)) == "from A, offline\n", "the conflict version is A's text", text(b.file(conflict)))
    check(text(b.file(name)) == "from B\n", "B's acknowledged text is the document on B", text(b.file(name)))
    check(wait_until(lambda: text(a.file(name)) == "from B\n", 20) is not None, "and on A", text(a.file(name)))
    check(text(b.file(kept)) == "acknowledged before the cut\n", "what A acknowledged before the cut is in the store")


def kill_case(network, a, b):
    print("-- SIGKILL of a daemon that holds a lock")
    name = "Shared.pkg/killed.txt"
    write_synced(a.file(name), "k\n")
    holder = Actor()
    try:
        fd = holder("open", a.file(name), os.O_RDONLY)["value"]
        check(holder("flock", fd, True, False)["ok"], "A takes the lock")
        a.process.kill()
        status, seconds, _ = flock_command(b.file(name), 30)
        check(status == 0 and 1 < seconds < LEASE + 4, f"B gets the killed daemon's lock after {seconds:.1f} s",
              f"flock exited {status}")
    finally:
        holder.end()
    a.process.wait(timeout=30)
    subprocess.run(["fusermount3", "-u", "-z", a.path], capture_output=True)
    a.start()
    check(text(a.file(name)) == "k\n", "A mounts again and reads the file")


def restart_case(network, server, a, b):
    print("-- a server restart while A holds a lock")
    name = "Shared.pkg/restart.txt"
    after = "Shared.pkg/after-restart.txt"
    write_synced(a.file(name), "R0\n")
    check(wait_until(lambda: text(b.file(name)) == "R0\n", 20) is not None, "B sees the file")
    holder = Actor()
    try:
        fd = holder("open", a.file(name), os.O_RDWR)["value"]
        check(holder("flock", fd, True, False)["ok"], "A takes the lock")
        holder("replace", fd, "R1\n")
        check(holder("fsync", fd)["ok"], "A's write before the restart is acknowledged")
        start = time.monotonic()
        server.stop()
        time.sleep(1)
        server.start()
        print(f"info  the server was down {time.monotonic() - start:.1f} s")
        # Time for the mounts' connections to come back, and for A's heartbeat to renew.
        time.sleep(3)
        status, _, _ = flock_command(b.file(name), 0)
        b_has_it = status == 0
        holder("replace", fd, "R2\n")
        synced = holder("fsync", fd)
        check(not (b_has_it and synced["ok"]), "never do A's holder and B both have the lock",
              f"B's flock {status}, A's fsync {synced}")
        if b_has_it:
            print("info  A's lease ended during the restart: B got the lock, A's holder got " + str(synced))
        else:
            check(synced["ok"], "A still holds the lock and saves after the restart", str(synced))
            holder("close", fd)
            status, seconds, seen = flock_command(b.file(name), 20, f"cat '{b.file(name)}'")
            check(status == 0 and seen == "R2\n", "B gets the lock A let go, and reads A's last write",
                  f"flock {status}, read {seen!r}")
    finally:
        holder.end()
    write_synced(a.file(after), "A after the restart\n")
    check(wait_until(lambda: text(b.file(after)) == "A after the restart\n", 20) is not None,
          "B sees a change A saved after the restart", text(b.file(after)))
    write_synced(b.file(after), "B after the restart\n")
    check(wait_until(lambda: text(a.file(after)) == "B after the restart\n", 20) is not None,
          "A sees a change B saved after the restart", text(a.file(after)))


def main():
    docfs = os.path.abspath(sys.argv[1])
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="docfs-partition.")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o755)  # the server runs as postgres, with its data folder inside
    tag = str(os.getpid() % 10000)
    network = server = None
    mounts = []
    try:
        network = Network(tag)
        server = Server(network, os.path.join(work, "pg"))
        server.psql("CREATE DATABASE docfs")
        url_a = f"postgres://postgres@{SERVER_A}:{PORT}/docfs"
        url_b = f"postgres://postgres@{SERVER_B}:{PORT}/docfs"
        run(network.enter(network.a) + [docfs, "create", url_a])
        a = Mount(docfs, network, network.a, url_a, os.path.join(work, "a"), os.path.join(work, "a.log"))
        mounts.append(a)
        os.mkdir(a.file("Shared.pkg"))
        for name in ("partition.txt",):
            write_synced(a.file("Shared.pkg/" + name), "0\n")
        b = Mount(docfs, network, network.b, url_b, os.path.join(work, "b"), os.path.join(work, "b.log"))
        mounts.append(b)
        check(wait_until(lambda: text(b.file("Shared.pkg/partition.txt")) == "0\n", 20) is not None,
              "B, on another host, sees A's file")
        partition_case(network, a, b)
        heal_case(network, a, b)
        kill_case(network, a, b)
        restart_case(network, server, a, b)
        for mount in mounts:
            status = mount.unmount()
            check(status == 0, f"the daemon of {mount.path} exits cleanly at unmount", f"exit {status}")
        mounts = []
        fsck = run(network.enter(network.a) + [docfs, "fsck", url_a], check_status=False, timeout=120)
        check(fsck.returncode == 0, "docfs fsck is clean", fsck.stdout + fsck.stderr)
    except Exception as error:  # a broken setup is a failure, with the work folder kept
        check(False, "the cases ran to the end", repr(error))
    finally:
        for mount in mounts:
            try:
                mount.kill()
            except Exception:
                pass
        if server:
            server.stop()
        if network:
            network.remove()
    if failures:
        print(f"partition: {len(failures)} FAILED; logs in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("partition: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
