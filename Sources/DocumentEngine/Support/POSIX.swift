import CLinuxSupport
import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// Thin, typed wrappers over the fd-relative syscalls the engine needs. Package writes go through
// directory file descriptors with O_NOFOLLOW so that nothing in a wrapper tree (a hostile name, a
// symlink planted inside a package) can make a write land outside its target folder.

enum POSIX {
    /// Retries `body` while it fails with EINTR; returns its result or throws its errno.
    @inline(__always)
    static func check<T: BinaryInteger>(_ body: () -> T) throws(Errno) -> T {
        while true {
            let r = body()
            if r != -1 { return r }
            let e = Errno(rawValue: errno)
            if e != .interrupted { throw e }
        }
    }

    static func open(_ path: String, _ flags: Int32, _ mode: mode_t = 0) throws(Errno) -> Int32 {
        try check { Glibc.open(path, flags | O_CLOEXEC, mode) }
    }

    static func openat(_ dirfd: Int32, _ name: String, _ flags: Int32, _ mode: mode_t = 0) throws(Errno)
        -> Int32
    {
        try check { Glibc.openat(dirfd, name, flags | O_CLOEXEC, mode) }
    }

    static func close(_ fd: Int32) {
        _ = Glibc.close(fd)
    }

    static func lstat(_ path: String) throws(Errno) -> stat {
        var st = stat()
        _ = try check { Glibc.lstat(path, &st) }
        return st
    }

    static func fstat(_ fd: Int32) throws(Errno) -> stat {
        var st = stat()
        _ = try check { Glibc.fstat(fd, &st) }
        return st
    }

    static func fstatat(_ dirfd: Int32, _ name: String, flags: Int32 = AT_SYMLINK_NOFOLLOW) throws(Errno)
        -> stat
    {
        var st = stat()
        _ = try check { Glibc.fstatat(dirfd, name, &st, flags) }
        return st
    }

    static func mkdirat(_ dirfd: Int32, _ name: String, _ mode: mode_t) throws(Errno) {
        _ = try check { Glibc.mkdirat(dirfd, name, mode) }
    }

    static func symlinkat(_ target: String, _ dirfd: Int32, _ name: String) throws(Errno) {
        _ = try check { Glibc.symlinkat(target, dirfd, name) }
    }

    /// Creates a special file (fifo, socket or device) named `name` in `dirfd`, readable and
    /// writable by its owner only until its permissions are applied. Fifos and sockets need no
    /// privilege; devices need `CAP_MKNOD` (EPERM otherwise).
    static func makeSpecialFile(_ kind: FileWrapper.Kind, device: UInt64, in dirfd: Int32, _ name: String)
        throws(Errno)
    {
        let type: mode_t
        switch kind {
        case .fifo: type = S_IFIFO
        case .socket: type = S_IFSOCK
        case .characterDevice: type = S_IFCHR
        case .blockDevice: type = S_IFBLK
        case .regularFile, .directory, .symbolicLink: throw .invalidArgument
        }
        _ = try check { Glibc.mknodat(dirfd, name, type | 0o600, dev_t(device)) }
    }

    static func linkat(_ olddirfd: Int32, _ oldname: String, _ newdirfd: Int32, _ newname: String)
        throws(Errno)
    {
        _ = try check { Glibc.linkat(olddirfd, oldname, newdirfd, newname, 0) }
    }

    static func unlinkat(_ dirfd: Int32, _ name: String, flags: Int32 = 0) throws(Errno) {
        _ = try check { Glibc.unlinkat(dirfd, name, flags) }
    }

    static func fsync(_ fd: Int32) throws(Errno) {
        _ = try check { Glibc.fsync(fd) }
    }

    static func readlinkat(_ dirfd: Int32, _ name: String) throws(Errno) -> String {
        var size = 256
        while true {
            var buffer = [UInt8](repeating: 0, count: size)
            let n = try check { Glibc.readlinkat(dirfd, name, &buffer, size) }
            if n < size {
                return String(decoding: buffer[0..<n], as: UTF8.self)
            }
            size *= 4
            if size > 1 << 20 { throw Errno.fileNameTooLong }
        }
    }

    static let renameNoReplace: UInt32 = 1
    static let renameExchange: UInt32 = 2

    /// renameat2(2) through the raw syscall, so it works whatever the C library exposes.
    static func renameat2(_ olddirfd: Int32, _ old: String, _ newdirfd: Int32, _ new: String, flags: UInt32)
        throws(Errno)
    {
        _ = try check { docfs_renameat2(olddirfd, old, newdirfd, new, flags) }
    }

    static func renameat(_ olddirfd: Int32, _ old: String, _ newdirfd: Int32, _ new: String) throws(Errno) {
        _ = try check { Glibc.renameat(olddirfd, old, newdirfd, new) }
    }

    /// Reads up to `count` bytes at `offset`; short only at end of file.
    static func pread(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, offset: Int64) throws(Errno)
        -> Int
    {
        var done = 0
        while done < buffer.count {
            let n = try check {
                Glibc.pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            }
            if n == 0 { break }
            done += n
        }
        return done
    }

    static func writeAll(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(Errno) {
        var done = 0
        while done < buffer.count {
            let n = try check { Glibc.write(fd, buffer.baseAddress! + done, buffer.count - done) }
            done += n
        }
    }

    static func writeAll(_ fd: Int32, _ data: Data) throws(Errno) {
        var failure: Errno?
        data.withUnsafeBytes { raw in
            guard raw.count > 0 else { return }
            do { try writeAll(fd, raw) } catch { failure = error as? Errno ?? .ioError }
        }
        if let failure { throw failure }
    }

    /// The process umask, read without changing it (umask(2) is racy across threads).
    static func currentUmask() -> mode_t {
        if let status = readSystemFile("/proc/self/status") {
            for line in status.split(separator: "\n") where line.hasPrefix("Umask:") {
                let value = line.dropFirst("Umask:".count).trimmingCharacters(in: .whitespaces)
                if let mask = mode_t(value, radix: 8) { return mask }
            }
        }
        return 0o022
    }

    /// Directory entries by raw name, without "." and "..".
    static func directoryEntries(_ dirfd: Int32) throws(Errno) -> [[UInt8]] {
        // fdopendir takes ownership of its fd, so hand it a duplicate.
        let dup = try check { Glibc.fcntl(dirfd, F_DUPFD_CLOEXEC, 0) }
        guard let dir = Glibc.fdopendir(dup) else {
            let e = Errno(rawValue: errno)
            Glibc.close(dup)
            throw e
        }
        defer { Glibc.closedir(dir) }
        Glibc.rewinddir(dir)
        var names: [[UInt8]] = []
        while true {
            errno = 0
            guard let entry = Glibc.readdir(dir) else {
                if errno != 0 { throw Errno(rawValue: errno) }
                break
            }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw -> [UInt8] in
                let bytes = raw.bindMemory(to: UInt8.self)
                let length = bytes.firstIndex(of: 0) ?? bytes.count
                return Array(bytes[0..<length])
            }
            if name == [0x2E] || name == [0x2E, 0x2E] { continue }
            names.append(name)
        }
        return names
    }

    /// Removes a directory tree through fds, never following symlinks.
    static func removeTree(_ dirfd: Int32, _ name: String) throws(Errno) {
        let st = try fstatat(dirfd, name)
        if (st.st_mode & S_IFMT) != S_IFDIR {
            try unlinkat(dirfd, name)
            return
        }
        let fd = try openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        defer { close(fd) }
        for entry in try directoryEntries(fd) {
            let child = String(decoding: entry, as: UTF8.self)
            // Names that are not valid UTF-8 cannot round-trip through String; remove them by bytes.
            if Array(child.utf8) == entry {
                try removeTree(fd, child)
            } else {
                try removeTreeRaw(fd, entry)
            }
        }
        try unlinkat(dirfd, name, flags: AT_REMOVEDIR)
    }

    private static func removeTreeRaw(_ dirfd: Int32, _ name: [UInt8]) throws(Errno) {
        let cName = name + [0]
        var failure: Errno?
        cName.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { chars in
                guard let base = chars.baseAddress else { return }
                var st = stat()
                if Glibc.fstatat(dirfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0 {
                    failure = Errno(rawValue: errno)
                    return
                }
                if (st.st_mode & S_IFMT) == S_IFDIR {
                    let fd = Glibc.openat(dirfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                    if fd < 0 {
                        failure = Errno(rawValue: errno)
                        return
                    }
                    defer { Glibc.close(fd) }
                    do throws(Errno) {
                        for entry in try directoryEntries(fd) { try removeTreeRaw(fd, entry) }
                    } catch {
                        failure = error
                        return
                    }
                    if Glibc.unlinkat(dirfd, base, AT_REMOVEDIR) != 0 { failure = Errno(rawValue: errno) }
                } else if Glibc.unlinkat(dirfd, base, 0) != 0 {
                    failure = Errno(rawValue: errno)
                }
            }
        }
        if let failure { throw failure }
    }

    // MARK: Extended attributes (user namespace only; see FileWrapper docs)

    static func listXattrs(_ fd: Int32) throws(Errno) -> [String] {
        var size = try check { CLinuxSupport.flistxattr(fd, nil, 0) }
        while true {
            if size == 0 { return [] }
            var buffer = [CChar](repeating: 0, count: size)
            let n = CLinuxSupport.flistxattr(fd, &buffer, size)
            if n < 0 {
                let e = Errno(rawValue: errno)
                if e == .outOfRange {
                    size = try check { CLinuxSupport.flistxattr(fd, nil, 0) }
                    continue
                }
                if e == .notSupported { return [] }
                throw e
            }
            return buffer[0..<n].split(separator: 0).map {
                String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            }
        }
    }

    static func listXattrs(path: String) throws(Errno) -> [String] {
        var size = CLinuxSupport.llistxattr(path, nil, 0)
        if size < 0 {
            let e = Errno(rawValue: errno)
            if e == .notSupported { return [] }
            throw e
        }
        while true {
            if size == 0 { return [] }
            var buffer = [CChar](repeating: 0, count: size)
            let n = CLinuxSupport.llistxattr(path, &buffer, size)
            if n < 0 {
                let e = Errno(rawValue: errno)
                if e == .outOfRange {
                    size = try check { CLinuxSupport.llistxattr(path, nil, 0) }
                    continue
                }
                throw e
            }
            return buffer[0..<n].split(separator: 0).map {
                String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            }
        }
    }

    static func getXattr(path: String, _ name: String) throws(Errno) -> Data {
        while true {
            let size = try check { CLinuxSupport.lgetxattr(path, name, nil, 0) }
            var data = Data(count: size)
            let n = data.withUnsafeMutableBytes { raw in
                CLinuxSupport.lgetxattr(path, name, raw.baseAddress, size)
            }
            if n < 0 {
                let e = Errno(rawValue: errno)
                if e == .outOfRange { continue }
                throw e
            }
            return data.prefix(n)
        }
    }

    static func setXattr(_ fd: Int32, _ name: String, _ value: Data) throws(Errno) {
        let result = value.withUnsafeBytes { raw in
            CLinuxSupport.fsetxattr(fd, name, raw.baseAddress, raw.count, 0)
        }
        if result != 0 { throw Errno(rawValue: errno) }
    }

    // MARK: Mount properties

    /// Whether files under `path` may be memory-mapped: not on FUSE or network file systems,
    /// where a mapping can fault (SIGBUS) when the server goes away.
    static func mappingAllowed(path: String) -> Bool {
        let fsType = docfs_fs_type(path)
        guard fsType >= 0 else { return false }
        let type = UInt64(fsType)
        let unmappable: Set<UInt64> = [
            0x6573_5546,  // FUSE
            0x6969,  // NFS
            0xFF53_4D42,  // CIFS
            0xFE53_4D42,  // SMB2
            0x517B,  // SMB
            0x0102_1997,  // 9P
            0x00C3_6400,  // Ceph
            0x5346_414F,  // AFS
        ]
        return !unmappable.contains(type)
    }
}

extension stat {
    var modificationDate: Date { st_mtim.date }

    var fileKind: FileWrapper.Kind? {
        switch st_mode & S_IFMT {
        case S_IFREG: return .regularFile
        case S_IFDIR: return .directory
        case S_IFLNK: return .symbolicLink
        case S_IFIFO: return .fifo
        case S_IFSOCK: return .socket
        case S_IFCHR: return .characterDevice
        case S_IFBLK: return .blockDevice
        default: return nil
        }
    }
}

/// Seconds from 1970 to 2001, Foundation's reference date.
private let referenceDateOffset = 978_307_200

extension timespec {
    /// Converted through the reference date, which keeps the most precision a `Date` can hold.
    var date: Date {
        Date(
            timeIntervalSinceReferenceDate: TimeInterval(tv_sec - referenceDateOffset) + TimeInterval(tv_nsec)
                / 1e9)
    }
}

extension Date {
    var timespec: timespec {
        let interval = timeIntervalSinceReferenceDate
        let seconds = interval.rounded(.down)
        var nanos = ((interval - seconds) * 1e9).rounded()
        var secs = Int(seconds) + referenceDateOffset
        if nanos >= 1e9 {
            nanos -= 1e9
            secs += 1
        }
        return Glibc.timespec(tv_sec: secs, tv_nsec: Int(nanos))
    }
}

extension Data {
    /// Copies the first bytes into `buffer`, as many as fit: the count copied. Through
    /// `withUnsafeBytes`, because `DataProtocol.copyBytes(to:)` is generic and unspecialized
    /// across modules, and its witness lookups were a measurable part of a 4 KiB read's CPU.
    package func copyPrefix(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        let count = Swift.min(self.count, buffer.count)
        guard count > 0, let to = buffer.baseAddress else { return 0 }
        withUnsafeBytes { bytes in
            if let from = bytes.baseAddress { to.copyMemory(from: from, byteCount: count) }
        }
        return count
    }
}
