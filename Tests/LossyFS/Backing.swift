import CLinuxSupport
import FUSE
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// The system calls lossyfs makes on its backing folder, throwing `Errno` instead of returning -1.
enum Backing {
    /// `O_PATH` (the same value on x86-64 and arm64; glibc hides it without `_GNU_SOURCE`).
    static let pathOnly: Int32 = 0o10000000
    /// `AT_EMPTY_PATH`: the call acts on the descriptor itself.
    static let emptyPath: Int32 = 0x1000

    /// Runs `body` with `name` as a NUL-terminated C string.
    @discardableResult
    static func withName<R>(_ name: FileName, _ body: (UnsafePointer<CChar>) throws(Errno) -> R) throws(Errno)
        -> R
    {
        var bytes = name.bytes.map { CChar(bitPattern: $0) }
        bytes.append(0)
        return try bytes.withUnsafeBufferPointer { buffer throws(Errno) -> R in
            guard let base = buffer.baseAddress else { throw Errno.invalidArgument }
            return try body(base)
        }
    }

    /// The path by which a descriptor can be opened again (works for unlinked files too).
    static func procPath(_ fd: Int32) -> String { "/proc/self/fd/\(fd)" }

    @discardableResult
    static func check(_ result: Int32) throws(Errno) -> Int32 {
        if result < 0 { throw Errno(rawValue: errno) }
        return result
    }

    @discardableResult
    static func check(_ result: Int) throws(Errno) -> Int {
        if result < 0 { throw Errno(rawValue: errno) }
        return result
    }

    static func stat(_ fd: Int32) throws(Errno) -> Glibc.stat {
        var st = Glibc.stat()
        try check(fstat(fd, &st))
        return st
    }

    /// `fstatat` without following a final symbolic link; nil when the name does not exist.
    static func stat(_ directory: Int32, _ name: FileName) throws(Errno) -> Glibc.stat? {
        var st = Glibc.stat()
        let rc = try withName(name) { fstatat(directory, $0, &st, AT_SYMLINK_NOFOLLOW) }
        if rc == 0 { return st }
        if errno == ENOENT { return nil }
        throw Errno(rawValue: errno)
    }

    static func openPath(_ directory: Int32, _ name: FileName) throws(Errno) -> Int32 {
        try withName(name) { name throws(Errno) in
            try check(openat(directory, name, pathOnly | O_NOFOLLOW | O_CLOEXEC))
        }
    }

    static func openPath(_ path: String) throws(Errno) -> Int32 {
        try check(open(path, pathOnly | O_DIRECTORY | O_CLOEXEC))
    }

    /// A readable and writable descriptor of the file `pathFD` is an `O_PATH` descriptor of.
    static func reopenForData(_ pathFD: Int32) throws(Errno) -> Int32 {
        try check(open(procPath(pathFD), O_RDWR | O_CLOEXEC))
    }

    static func rename(
        _ fromDirectory: Int32, _ from: FileName, _ toDirectory: Int32, _ to: FileName, flags: UInt32 = 0
    ) throws(Errno) {
        try withName(from) { from throws(Errno) in
            try withName(to) { to throws(Errno) in
                try check(docfs_renameat2(fromDirectory, from, toDirectory, to, flags))
            }
        }
    }

    /// A new name `to` for the file named `from` (not a directory).
    static func link(_ fromDirectory: Int32, _ from: FileName, _ toDirectory: Int32, _ to: FileName)
        throws(Errno)
    {
        try withName(from) { from throws(Errno) in
            try withName(to) { to throws(Errno) in try check(linkat(fromDirectory, from, toDirectory, to, 0))
            }
        }
    }

    /// A new name for the file `pathFD` is an `O_PATH` descriptor of.
    static func link(_ pathFD: Int32, _ toDirectory: Int32, _ to: FileName) throws(Errno) {
        try withName(to) { to throws(Errno) in try check(linkat(pathFD, "", toDirectory, to, emptyPath)) }
    }

    static func unlink(_ directory: Int32, _ name: FileName, directoryToo: Bool = false) throws(Errno) {
        try withName(name) { name throws(Errno) in
            try check(unlinkat(directory, name, directoryToo ? AT_REMOVEDIR : 0))
        }
    }

    /// Gives a new node the requester's owner; lossyfs runs as root and so creates everything as root.
    static func chown(_ directory: Int32, _ name: FileName, uid: UInt32, gid: UInt32) throws(Errno) {
        try withName(name) { name throws(Errno) in
            try check(fchownat(directory, name, uid, gid, AT_SYMLINK_NOFOLLOW))
        }
    }

    /// The names in the directory `pathFD` is a descriptor of, with their inode and type, `.`
    /// and `..` included.
    static func list(_ pathFD: Int32) throws(Errno) -> [(name: FileName, ino: UInt64, type: UInt8)] {
        let fd = try check(open(procPath(pathFD), O_RDONLY | O_DIRECTORY | O_CLOEXEC))
        guard let stream = fdopendir(fd) else {
            close(fd)
            throw Errno(rawValue: errno)
        }
        defer { closedir(stream) }
        var entries: [(name: FileName, ino: UInt64, type: UInt8)] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                FileName(bytes: Array(raw.prefix { $0 != 0 }))
            }
            entries.append((name, UInt64(entry.pointee.d_ino), entry.pointee.d_type))
        }
        return entries
    }

    /// Removes `name` in `directory` and everything under it.
    static func removeTree(_ directory: Int32, _ name: FileName) {
        guard let st = try? stat(directory, name) else { return }
        if st.st_mode & S_IFMT == S_IFDIR, let fd = try? openPath(directory, name) {
            for entry in (try? list(fd)) ?? [] where !entry.name.isDotOrDotDot {
                removeTree(fd, entry.name)
            }
            close(fd)
            try? unlink(directory, name, directoryToo: true)
        } else {
            try? unlink(directory, name)
        }
    }

    /// Reads `count` bytes at `offset` into the start of `array`, stopping early only at end of
    /// file (the rest stays as it was).
    static func read(_ fd: Int32, into array: inout [UInt8], count: Int, at offset: UInt64) throws(Errno) {
        var failure: Errno?
        array.withUnsafeMutableBytes { raw in
            do throws(Errno) {
                try readFully(fd, into: UnsafeMutableRawBufferPointer(rebasing: raw[..<count]), at: offset)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
    }

    /// Writes the first `count` bytes of `array` at `offset`.
    static func write(_ fd: Int32, _ array: [UInt8], count: Int, at offset: UInt64) throws(Errno) {
        var failure: Errno?
        array.withUnsafeBytes { raw in
            do throws(Errno) {
                try writeFully(fd, UnsafeRawBufferPointer(rebasing: raw[..<count]), at: offset)
            } catch {
                failure = error
            }
        }
        if let failure { throw failure }
    }

    /// Reads exactly `count` bytes at `offset` into `buffer`, stopping early only at end of file.
    static func readFully(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: UInt64)
        throws(Errno)
    {
        guard let base = buffer.baseAddress else { return }
        var done = 0
        while done < buffer.count {
            let n = pread(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            if n == 0 { return }
            done += n
        }
    }

    static func writeFully(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, at offset: UInt64) throws(Errno) {
        guard let base = buffer.baseAddress else { return }
        var done = 0
        while done < buffer.count {
            let n = pwrite(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            done += n
        }
    }
}
