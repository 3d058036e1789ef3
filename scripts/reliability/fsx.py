#!/usr/bin/env python3
"""fsx for a DocFS mount: random operations on files, each checked against an in-memory model.

    fsx.py DIR SEED OPS [--model-out DIR2] [--quiet]

DIR is a folder in a mount (a package document, or the mount root: then the files are flat
documents). Operations: write (pwrite), read (pread), truncate (ftruncate), mapwrite/mapread
(a shared writable mmap, msync), fallocate (mode 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE), rename
(to a new name or onto another file), unlink (while open: the descriptor keeps its file),
fsync, close, open. After every operation the descriptor's size (fstat) is checked; reads and
mapreads are checked byte for byte. On a mismatch or an unexpected error it prints the seed and
the log of operations and exits 1. At the end it closes everything, reads every file through the
mount and, with --model-out, writes the model's final files to DIR2 (for a check of the store).
"""
import ctypes
import ctypes.util
import errno
import mmap
import os
import random
import sys
import zlib

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
FALLOC_FL_KEEP_SIZE = 1
FALLOC_FL_PUNCH_HOLE = 2

MAX_SIZE = 1_200_000  # crosses several 256 KiB chunks
PAGE = mmap.ALLOCATIONGRANULARITY


def fallocate(fd, mode, offset, length):
    if libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Failure(Exception):
    pass


class Inode:
    _next = 0

    def __init__(self):
        Inode._next += 1
        self.number = Inode._next
        self.data = bytearray()


def pattern(rng, n):
    return rng.randbytes(n)


class Fsx:
    def __init__(self, directory, seed, ops, quiet):
        self.dir = directory
        self.seed = seed
        self.ops = ops
        self.quiet = quiet
        self.rng = random.Random(seed)
        self.log = []
        self.names = {}  # name -> Inode
        self.fds = []  # [fd, Inode, name-or-None]
        self.serial = 0
        self.counts = {}

    # -- helpers
    def note(self, text):
        self.log.append(f"{len(self.log)}: {text}")

    def fail(self, text):
        raise Failure(text)

    def path(self, name):
        return os.path.join(self.dir, name)

    def new_name(self):
        self.serial += 1
        return f"fsx{self.seed % 1000}-{self.serial}.bin"

    def check_size(self, fd, inode, what):
        size = os.fstat(fd).st_size
        if size != len(inode.data):
            self.fail(f"{what}: fstat size {size}, model {len(inode.data)}")

    def check_bytes(self, got, inode, offset, count, what):
        want = bytes(inode.data[offset:offset + count])
        if got != want:
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
            self.fail(f"{what}: {len(got)} bytes read, {len(want)} expected; first difference at "
                      f"{offset + first} (got {got[first:first+8].hex()} want {want[first:first+8].hex()})")

    def pick_fd(self):
        if not self.fds or (len(self.fds) < 4 and self.rng.random() < 0.1):
            return self.op_open()
        return self.rng.choice(self.fds)

    def range_for(self, inode, grow=True):
        size = len(inode.data)
        limit = MAX_SIZE if grow else max(size, 1)
        r = self.rng.random()
        if r < 0.3:
            length = self.rng.randint(1, 64)
        elif r < 0.8:
            length = self.rng.randint(1, 20_000)
        else:
            length = self.rng.randint(1, 300_000)
        if self.rng.random() < 0.2 and size > 0:
            offset = self.rng.randint(max(0, size - 100), size)  # near the end
        else:
            offset = self.rng.randint(0, limit - 1)
        length = max(1, min(length, limit - offset))
        return offset, length

    # -- operations
    def op_open(self):
        if self.names and self.rng.random() < 0.8:
            name = self.rng.choice(sorted(self.names))
            inode = self.names[name]
            trunc = self.rng.random() < 0.05
            flags = os.O_RDWR | (os.O_TRUNC if trunc else 0)
            self.note(f"open {name}{' O_TRUNC' if trunc else ''}")
            fd = os.open(self.path(name), flags | os.O_CLOEXEC)
            if trunc:
                inode.data = bytearray()
        else:
            name = self.new_name()
            self.note(f"create {name}")
            fd = os.open(self.path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            inode = Inode()
            self.names[name] = inode
        entry = [fd, inode, name]
        self.fds.append(entry)
        self.check_size(fd, inode, "open")
        return entry

    def op_write(self, entry):
        fd, inode, _ = entry
        offset, length = self.range_for(inode)
        data = pattern(self.rng, length)
        self.note(f"write fd{fd} ino{inode.number} [{offset}, +{length})")
        n = os.pwrite(fd, data, offset)
        if n != length:
            self.fail(f"short write {n} of {length}")
        if offset > len(inode.data):
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset:offset + length] = data

    def op_read(self, entry):
        fd, inode, _ = entry
        offset, length = self.range_for(inode, grow=False)
        if self.rng.random() < 0.1:
            offset, length = 0, len(inode.data) + 10
        self.note(f"read fd{fd} ino{inode.number} [{offset}, +{length})")
        got = b""
        while len(got) < length:
            part = os.pread(fd, length - len(got), offset + len(got))
            if not part:
                break
            got += part
        self.check_bytes(got, inode, offset, length, "read")

    def op_truncate(self, entry):
        fd, inode, _ = entry
        size = self.rng.choice([0, self.rng.randint(0, MAX_SIZE), self.rng.randint(0, len(inode.data) + 1)])
        self.note(f"truncate fd{fd} ino{inode.number} to {size}")
        os.ftruncate(fd, size)
        if size < len(inode.data):
            del inode.data[size:]
        else:
            inode.data.extend(bytes(size - len(inode.data)))

    def op_mapwrite(self, entry, write=True):
        fd, inode, _ = entry
        size = len(inode.data)
        if size == 0:
            return self.op_write(entry)
        offset = self.rng.randint(0, size - 1)
        length = self.rng.randint(1, min(size - offset, 100_000))
        start = offset - offset % PAGE
        span = offset + length - start
        what = "mapwrite" if write else "mapread"
        self.note(f"{what} fd{fd} ino{inode.number} [{offset}, +{length})")
        m = mmap.mmap(fd, span, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        try:
            if write:
                data = pattern(self.rng, length)
                m[offset - start:offset - start + length] = data
                m.flush()  # msync(MS_SYNC)
                inode.data[offset:offset + length] = data
            else:
                got = m[offset - start:offset - start + length]
                self.check_bytes(got, inode, offset, length, "mapread")
        finally:
            m.close()

    def op_fallocate(self, entry):
        fd, inode, _ = entry
        offset, length = self.range_for(inode)
        mode = self.rng.choice([0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE])
        self.note(f"fallocate fd{fd} ino{inode.number} mode {mode} [{offset}, +{length})")
        fallocate(fd, mode, offset, length)
        size = len(inode.data)
        end = offset + length
        if mode & FALLOC_FL_PUNCH_HOLE:
            hole_end = min(end, size)
            if offset < hole_end:
                inode.data[offset:hole_end] = bytes(hole_end - offset)
        elif not mode & FALLOC_FL_KEEP_SIZE and end > size:
            inode.data.extend(bytes(end - size))

    def op_fsync(self, entry):
        fd, inode, _ = entry
        self.note(f"fsync fd{fd} ino{inode.number}")
        os.fsync(fd)

    def op_close(self, entry):
        fd, inode, _ = entry
        self.note(f"close fd{fd} ino{inode.number}")
        self.fds.remove(entry)
        os.close(fd)

    def op_rename(self, entry):
        if not self.names:
            return
        source = self.rng.choice(sorted(self.names))
        if len(self.names) > 1 and self.rng.random() < 0.4:
            target = self.rng.choice(sorted(n for n in self.names if n != source))
        else:
            target = self.new_name()
        self.note(f"rename {source} -> {target}")
        os.rename(self.path(source), self.path(target))
        inode = self.names.pop(source)
        self.names[target] = inode  # the target's old inode lives on in its descriptors only
        for e in self.fds:
            if e[2] == target and e[1] is not inode:
                e[2] = None
            elif e[2] == source:
                e[2] = target

    def op_unlink(self, entry):
        if len(self.names) < 3:
            return
        name = self.rng.choice(sorted(self.names))
        self.note(f"unlink {name}")
        os.unlink(self.path(name))
        del self.names[name]
        for e in self.fds:
            if e[2] == name:
                e[2] = None

    def step(self):
        entry = self.pick_fd()
        r = self.rng.random()
        table = [
            (0.25, "write", self.op_write),
            (0.43, "read", self.op_read),
            (0.50, "truncate", self.op_truncate),
            (0.60, "mapwrite", lambda e: self.op_mapwrite(e, True)),
            (0.66, "mapread", lambda e: self.op_mapwrite(e, False)),
            (0.74, "fallocate", self.op_fallocate),
            (0.80, "fsync", self.op_fsync),
            (0.88, "close", self.op_close),
            (0.94, "rename", self.op_rename),
            (1.01, "unlink", self.op_unlink),
        ]
        for limit, name, op in table:
            if r < limit:
                self.counts[name] = self.counts.get(name, 0) + 1
                op(entry)
                if name != "close" and entry in self.fds:
                    self.check_size(entry[0], entry[1], name)
                return

    def finish(self):
        for entry in list(self.fds):
            self.op_close(entry)
        on_disk = sorted(n for n in os.listdir(self.dir) if n.startswith(f"fsx{self.seed % 1000}-"))
        if on_disk != sorted(self.names):
            self.fail(f"names in the folder {on_disk}, model {sorted(self.names)}")
        for name, inode in self.names.items():
            self.note(f"final read {name}")
            with open(self.path(name), "rb") as f:
                got = f.read()
            self.check_bytes(got, inode, 0, len(inode.data) + 1, f"final read of {name}")

    def run(self):
        try:
            for _ in range(self.ops):
                self.step()
            self.finish()
        except (Failure, OSError) as error:
            print(f"fsx FAILED (seed {self.seed}, dir {self.dir}): {error}", file=sys.stderr)
            print("operation log (last 60):", file=sys.stderr)
            for line in self.log[-60:]:
                print("  " + line, file=sys.stderr)
            print(f"reproduce: fsx.py DIR {self.seed} {self.ops}", file=sys.stderr)
            return False
        if not self.quiet:
            summary = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
            print(f"fsx ok: seed {self.seed}, {self.ops} operations ({summary}); "
                  f"{len(self.names)} files, {sum(len(i.data) for i in self.names.values())} bytes")
        return True


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    quiet = "--quiet" in sys.argv
    model_out = None
    if "--model-out" in sys.argv:
        model_out = sys.argv[sys.argv.index("--model-out") + 1]
        args.remove(model_out)
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    directory, seed, ops = args[0], int(args[1]), int(args[2])
    fsx = Fsx(directory, seed, ops, quiet)
    ok = fsx.run()
    if ok and model_out:
        os.makedirs(model_out, exist_ok=True)
        for name, inode in fsx.names.items():
            with open(os.path.join(model_out, name), "wb") as f:
                f.write(inode.data)
            print(f"model {name} {len(inode.data)} crc {zlib.crc32(inode.data):08x}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
